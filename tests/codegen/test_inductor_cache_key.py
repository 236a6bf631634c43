"""Inductor's own FX-graph cache keys on our code generation sources
(codegen/inductor._OurLowerings): the lowerings we register with Inductor
are not in its key, so without ours a changed lowering would be served the
code compiled before the change."""
import torch
from torch._dynamo.utils import counters
from torch.fx.experimental.proxy_tensor import make_fx

from lazy_mlir.codegen import inductor
from lazy_mlir.lowering.group_lowering import fake_inputs_of


def _lookups(tmp_path, monkeypatch) -> dict:
    """Inductor's cache hits and misses compiling one small graph, cache in ``tmp_path``."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    x = torch.randn(8, 16)
    gm = make_fx(lambda t: ((torch.tanh(t) * 3).sum(0),))(x)
    fake_mode, fakes = fake_inputs_of([x])
    counters.clear()
    run, _, _ = inductor.compile_graph(gm, fakes, fake_mode, "cache_key_test")
    torch.testing.assert_close(run([x])[0], (torch.tanh(x) * 3).sum(0))
    return {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}


def test_a_change_to_our_codegen_misses_inductors_cache(tmp_path, monkeypatch):
    assert _lookups(tmp_path, monkeypatch) == {"fxgraph_cache_miss": 1}
    assert _lookups(tmp_path, monkeypatch) == {"fxgraph_cache_hit": 1}
    monkeypatch.setattr(inductor, "_codegen_digest", lambda: "edited sources")
    assert _lookups(tmp_path, monkeypatch) == {"fxgraph_cache_miss": 1}
