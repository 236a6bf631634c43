"""IR dumps (Config.dump_dir, LAZY_MLIR_DUMP_DIR): checked at init(), named
per rank, and never a reason for a step to run differently."""
import os

import pytest
import torch

import lazy_mlir
from lazy_mlir import config
from lazy_mlir.observe import dump
from helpers import LAZY, assert_compiled, assert_same_training, make_mlp, mlp_batches, sgd, train

CPU = torch.device("cpu")


def _not_a_directory(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    return blocker / "dumps"  # cannot be created: its parent is a file


def test_init_rejects_a_dump_dir_it_cannot_create(tmp_path):
    before = config.current
    bad = _not_a_directory(tmp_path)
    with pytest.raises(ValueError, match=r"lazy_mlir: dump_dir '.*a_file/dumps' cannot be used for IR dumps"):
        lazy_mlir.init("O1", dump_dir=str(bad))
    assert config.current is before  # a failed init() changes nothing


def test_init_names_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("LAZY_MLIR_DUMP_DIR", str(_not_a_directory(tmp_path)))
    with pytest.raises(ValueError, match=r"LAZY_MLIR_DUMP_DIR '.*a_file/dumps' cannot be used"):
        lazy_mlir.init("O1")


def test_init_creates_the_dump_dir_and_leaves_no_probe(lazy_level, tmp_path):
    target = tmp_path / "nested" / "dumps"
    lazy_mlir.init("O1", dump_dir=str(target))
    assert target.is_dir() and os.listdir(target) == []


def test_dump_names_carry_the_rank(lazy_level, tmp_path, gloo_world):
    lazy_mlir.init("O1", dump_dir=str(tmp_path / "dumps"))
    dump.write("graph1.g0", "2.mlir", "module {}")
    assert os.listdir(tmp_path / "dumps") == ["graph1.g0.rank0.2.mlir"]


def test_full_disk_is_a_warning_and_leaves_no_truncated_file(lazy_level, tmp_path):
    lazy_mlir.init("O1", dump_dir=str(tmp_path))
    target = tmp_path / "graph1.g0.2.mlir"
    os.symlink("/dev/full", target)  # every write there fails with ENOSPC
    with pytest.warns(RuntimeWarning, match=r"could not write the IR dump .*graph1\.g0\.2\.mlir .*No space left"):
        dump.write("graph1.g0", "2.mlir", "module {}" * 10000)
    assert not os.path.lexists(target)
    dump.write("graph1.g0", "3.mlir", "module {}")  # later dumps are still written
    assert (tmp_path / "graph1.g0.3.mlir").read_text() == "module {}"


@pytest.mark.parametrize("lazy_level", ["O1", "O2"], indirect=True)
def test_dump_failure_changes_nothing_that_runs(lazy_level, tmp_path):
    """The directory becomes unusable after init(): every dump of the step's
    compile fails, yet the groups compile and run their generated code (no
    TorchScript fallback at O1, no error at O2), with eager's numbers."""
    dump_dir = tmp_path / "dumps"
    lazy_mlir.init(lazy_level, dump_dir=str(dump_dir))
    os.rmdir(dump_dir)
    dump_dir.write_text("")  # now a file: makedirs and open fail
    batches = mlp_batches(3, batch=43)  # a batch size no other test compiles: the dumps are attempted
    with pytest.warns(RuntimeWarning, match="could not write the IR dump"):
        lazy = train(make_mlp, sgd, batches, LAZY)
    assert_compiled(calls=3)
    assert_same_training(train(make_mlp, sgd, batches, CPU), lazy)
    assert dump_dir.read_text() == ""
