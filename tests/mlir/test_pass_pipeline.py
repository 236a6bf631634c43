"""mlir_passes' Python API: pipelines, per-pass callbacks, ids, errors."""
import dataclasses

import pytest
from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

import mlir_passes
from mlir_passes import opt

SOURCE = """
func.func @f(%arg0: !torch.vtensor<[4,3],f32>) -> (!torch.vtensor<[3,4],f32>, !torch.int, !torch.int) {
  %int1 = torch.constant.int 1
  %int1_0 = torch.constant.int 1
  %0 = torch.aten.t_copy %arg0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  return %0, %int1, %int1_0 : !torch.vtensor<[3,4],f32>, !torch.int, !torch.int
}
"""


def parse(text: str) -> ir.Module:
    context = ir.Context()
    torch_d.register_dialect(context)
    return ir.Module.parse(text, context)


def test_python_and_mlir_passes_run_in_order_with_a_callback_after_each():
    module = parse(SOURCE)
    seen = []
    mlir_passes.run_pipeline(module, "fold-copy-ops,cse", on_pass_done=lambda name, m: seen.append((name, str(m))))
    assert [name for name, _ in seen] == ["fold-copy-ops", "cse"]
    assert "t_copy" not in seen[0][1] and seen[0][1].count("torch.constant.int 1") == 2
    assert seen[1][1].count("torch.constant.int 1") == 1


def test_a_pass_error_names_the_op_and_its_location():
    module = parse(SOURCE.replace("vtensor", "tensor"))
    with pytest.raises(mlir_passes.PassError, match=r"fold-copy-ops: 'torch.aten.t_copy' at \"-\":5:8: expects value"):
        mlir_passes.run_pipeline(module, "fold-copy-ops")


def test_unknown_flags_list_the_known_ones():
    with pytest.raises(mlir_passes.PipelineError, match="unknown pass 'nope'; known passes: .*fold-copy-ops"):
        mlir_passes.run_pipeline(parse(SOURCE), "fold-copy-ops,nope")


def test_pipeline_ids_follow_passes_options_and_order():
    assert mlir_passes.pipeline_id("cse,canonicalize") == mlir_passes.pipeline_id(" cse , canonicalize ")
    assert mlir_passes.pipeline_id("canonicalize") == mlir_passes.pipeline_id("canonicalize{max-iterations=10}")
    assert mlir_passes.pipeline_id("canonicalize") != mlir_passes.pipeline_id("canonicalize{max-iterations=3}")
    assert mlir_passes.pipeline_id("cse,canonicalize") != mlir_passes.pipeline_id("canonicalize,cse")


def test_light_ids_read_the_package_without_mlir():
    """Config.key() takes the light id, read from the package's files, so
    that a process running cached code never imports MLIR; a spec with
    options or a flag no module is named after gets None (the full id)."""
    assert mlir_passes.light_pipeline_id("cse,canonicalize") == mlir_passes.light_pipeline_id(" cse , canonicalize ")
    assert mlir_passes.light_pipeline_id("cse,canonicalize") != mlir_passes.light_pipeline_id("canonicalize,cse")
    for flag in mlir_passes.available_passes():
        assert mlir_passes.light_pipeline_id(flag) is not None, flag
    for spec in ("canonicalize{max-iterations=3}", "nope", "base", "pipeline", "torch-ir", "cse,,cse"):
        assert mlir_passes.light_pipeline_id(spec) is None, spec


def test_options_are_typed_fields():
    (canonicalize,) = mlir_passes.parse_pipeline("canonicalize{max-iterations=3 top-down=false}")
    assert (canonicalize.max_iterations, canonicalize.top_down) == (3, False)
    assert canonicalize.spec() == "canonicalize{max-iterations=3,top-down=false}"
    with pytest.raises(dataclasses.FrozenInstanceError):
        canonicalize.top_down = True


def test_every_pass_is_described_and_the_default_pipeline_parses():
    for flag in mlir_passes.available_passes():
        assert mlir_passes.get_pass(flag).description()
    assert [p.name for p in mlir_passes.parse_pipeline(mlir_passes.DEFAULT_PIPELINE)] == [
        "fold-copy-ops", "scalar-implicit-to-tensor", "specialize-scalars", "cse"]


def test_a_pass_must_live_in_the_file_named_after_its_flag():
    @dataclasses.dataclass(frozen=True)
    class Misplaced(mlir_passes.Pass):
        name = "misplaced"

    with pytest.raises(ValueError, match="must live in a file named misplaced.py"):
        mlir_passes.register(Misplaced)


def test_opt_lists_the_passes(capsys):
    assert opt.main(["--list-passes"]) == 0
    listing = capsys.readouterr().out
    assert all(flag in listing for flag in mlir_passes.available_passes())
