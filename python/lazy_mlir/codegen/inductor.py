"""Inductor code generation for one fusion group (C++ on CPU, Triton on GPU).

The graph is compiled with the converter's fake tensors under a
TracingContext of the same FakeTensorMode: Inductor then takes its FX-graph
and AOT caches (a warm compile ~2 s instead of ~20 s); compiling on real
tensors bypasses them ("No shape env"). With ``serializable`` it compiles
through ``standalone_compile(aot=True)``, whose artefact (the generated code
with AOTAutograd's wrappers) is bytes another process loads without
tracing or compiling the graph again.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import warnings

import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._subclasses.fake_tensor import FakeTensorMode

from . import inductor_fixes, inlining_bound, memory_order, onednn_linear


# Inductor fuses independent kernels ("horizontally") only when they read at
# least this many bytes in common (its default: 10). Above the 24 bytes of
# Adam's per-step scalars, which every parameter's update reads: those
# updates stay each after its gradient (lowering/fused_optimizer.py).
FUSION_MEMORY_THRESHOLD = 32


class _OurLowerings(CustomGraphPass):
    """Our post-grad pass (inlining_bound), whose id also keys Inductor's
    own caches on this package's code generation sources: Inductor's
    FX-graph cache keys on the graph and its config, not on lowerings
    registered from outside (onednn_linear.register_with_inductor), so after
    a change to those it would serve code compiled before it, into our new
    cache entries."""

    def __call__(self, graph: fx.Graph) -> None:
        inlining_bound.bound(graph)

    def uuid(self) -> str:
        return _codegen_digest()


@functools.cache
def _codegen_digest() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.sha256()
    for name in sorted(f for f in os.listdir(here) if f.endswith(".py")):
        with open(os.path.join(here, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()


_OUR_LOWERINGS = _OurLowerings()


def compile_graph(gm: fx.GraphModule, fake_inputs: list, fake_mode: FakeTensorMode, name: str,
                  serializable: bool = False, cpp_wrapper: bool = False):
    """Returns (callable list[Tensor] -> list[Tensor], generated source,
    artefact bytes or None). ``fake_inputs`` carry the real inputs' shapes,
    dtypes and strides. ``cpp_wrapper``: Inductor's C++ wrapper around the
    kernels of a CPU graph without collectives (Config.cpp_wrapper)."""
    from torch._inductor.codecache import PyCodeCache

    inductor_fixes.install()  # before any kernel is generated, cached graphs' included
    inductor_fixes.rewrite(gm)  # around Inductor's defects in the graph (an add's alpha dropped)
    onednn_linear.register_with_inductor()
    loaded_before = set(PyCodeCache.modules)
    planned = collective_issue_order(gm.code)
    # With collectives, the zero passes scheduled the graph under their memory
    # budget; Inductor's peak-memory reordering would undo it (it starts
    # each gather just before its wait, and pulls optimizer updates into
    # backward, serializing every collective).
    options = {"score_fusion_memory_threshold": FUSION_MEMORY_THRESHOLD, "post_grad_custom_post_pass": _OUR_LOWERINGS}
    if planned:
        options["reorder_for_peak_memory"] = False
    if cpp_wrapper and not planned and all(t.device.type == "cpu" for t in fake_inputs):
        options["cpp_wrapper"] = True
        # The wrapper and the kernels as two libraries, the wrapper (a call
        # per kernel, its buffers' lifetimes) built at Inductor's -O1 for it:
        # one library at -O3 spent most of a big group's compile in gcc on
        # the wrapper's one long function (EfficientNet-B0's 1114 ops: 146 s
        # -> 73 s cold), for no step time measured (docs/compile-cache.md).
        options["cpp_wrapper_build_separate"] = True
        # The C++ wrapper checks its inputs' layouts against the placeholders'
        # values, which the export made contiguous; the code is compiled for
        # the real inputs' strides (LTC hands over transposed buffers too).
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for node, fake in zip(placeholders, fake_inputs):
            node.meta["val"] = fake
    # a step's order that frees gradients as soon as they are final (memory_order)
    with _python_floats_of_sizes_kept(), memory_order.candidate_orders():
        compiled, artefact = _compile(gm, fake_inputs, fake_mode, options, name, serializable)
    new_modules = [m for m in PyCodeCache.modules if m not in loaded_before]
    code = "\n\n".join(_source_of(m) for m in new_modules)
    # The zero passes chose when each collective starts: Inductor keeps that
    # order (it chains collectives in graph order), and moves waits only
    # later, to the kernel that first uses the result. Checked, not assumed.
    if code and collective_issue_order(code) != planned:
        raise RuntimeError(f"lazy_mlir: Inductor reordered the collectives of {name}: "
                           f"planned {planned}, generated {collective_issue_order(code)}")
    code = code or "# (served from Inductor's cache)"

    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(compiled(*inputs))

    return run, code, artefact


def _compile(gm, fake_inputs, fake_mode, options, name, serializable):
    """(the compiled callable, its serialized artefact or None)."""
    compiled = artefact = None
    if serializable:
        compiled = _standalone(gm, fake_inputs, fake_mode, options)
        artefact = _serialize(compiled) if compiled is not None else None
    if compiled is None:  # not serializable, or standalone_compile refused the graph
        try:
            compiled = _compile_fx(gm, fake_inputs, fake_mode, options)
        except Exception as exc:
            if not options.get("cpp_wrapper"):
                raise
            warnings.warn(f"lazy_mlir: Inductor's C++ wrapper failed for {name} ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}); it gets the Python wrapper",
                          RuntimeWarning, stacklevel=2)
            compiled = _compile_fx(gm, fake_inputs, fake_mode, dict(options, cpp_wrapper=False))
    return compiled, artefact


@contextlib.contextmanager
def _python_floats_of_sizes_kept():
    """Python floats of sizes (BatchNorm's running variance scales by
    n/(n-1)) left to Inductor's own symbolic code. AOT's pass that turns
    them into tensor ops (tensorify_python_scalars) looks each size symbol
    up among the graph's nodes: Dynamo's graphs have one SymInt input per
    symbol, ours none, so a shape-generic graph failed with KeyError on a
    size symbol. A static graph has no such floats: the pass changes
    nothing there. Its only switch is an environment variable, set for the
    compile (the process's other compiles meanwhile see it too)."""
    before = os.environ.get(_TENSORIFY)
    os.environ[_TENSORIFY] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[_TENSORIFY]
        else:
            os.environ[_TENSORIFY] = before


_TENSORIFY = "TENSORIFY_PYTHON_SCALARS"


def _compile_fx(gm, fake_inputs, fake_mode, options):
    from torch._inductor.compile_fx import compile_fx

    with torch._guards.tracing(torch._guards.TracingContext(fake_mode)), torch.no_grad(), \
            torch._inductor.config.patch(options):
        return compile_fx(gm, fake_inputs)


def _standalone(gm, fake_inputs, fake_mode, options):
    from torch._inductor.standalone_compile import standalone_compile
    try:
        with torch.no_grad():
            return standalone_compile(gm, fake_inputs, dynamic_shapes="from_example_inputs", fake_mode=fake_mode,
                                      options={"config_patches": options}, aot=True)
    except Exception:  # noqa: BLE001 - compile_fx gets its turn; its errors are the ones reported
        return None


def _serialize(compiled) -> bytes | None:
    try:
        return compiled.serialize()
    except Exception:  # noqa: BLE001 - the cache keeps the FX graph alone
        return None


def load_artefact(artefact: bytes):
    """A callable list[Tensor] -> list[Tensor] from ``compile_graph``'s artefact
    (kernels Inductor's own cache no longer holds are compiled again)."""
    from torch._inductor.standalone_compile import AOTCompiledArtifact

    inductor_fixes.install()
    compiled = AOTCompiledArtifact.deserialize(artefact)

    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(compiled(*inputs))

    return run


_COLLECTIVE_CALL = re.compile(r"^[^#\n]*torch\.ops\._c10d_functional\.(all_gather_into_tensor|reduce_scatter_tensor|"
                              r"all_reduce|all_to_all_single)_?(?:_out)?\.default\(", re.M)
_LETTER = {"all_gather_into_tensor": "G", "reduce_scatter_tensor": "R", "all_reduce": "A", "all_to_all_single": "T"}


def collective_issue_order(python_code: str) -> str:
    """The order in which FX or generated code starts collectives: G(ather),
    R(educe-scatter), A(ll-reduce), all-to-all (T), e.g. "GGGRRA"."""
    return "".join(_LETTER[m.group(1)] for m in _COLLECTIVE_CALL.finditer(python_code))


def _source_of(module) -> str:
    path = getattr(module, "__file__", None)
    if not path:
        return ""
    with open(path) as f:
        return f"# {path}\n" + f.read()
