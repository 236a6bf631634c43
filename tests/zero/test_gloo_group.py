"""The traced ZeRO collectives run on a single-thread gloo group (two gloo
worker threads with collectives in flight race: see zero/groups.py);
the eager ones take tensors on the device the group's backend works on."""
from __future__ import annotations

import torch
import torch.distributed as dist

from lazy_mlir.zero.groups import collective_device, collective_group


def _threads(group) -> int:
    return group._get_backend(torch.device("cpu")).options._threads


def test_gloo_group_gets_a_single_thread_twin(gloo_world):
    assert _threads(gloo_world) == 2  # gloo's default: the case that races
    serial = collective_group(gloo_world)
    assert serial is not gloo_world and _threads(serial) == 1
    assert dist.get_process_group_ranks(serial) == dist.get_process_group_ranks(gloo_world)
    assert serial._get_backend(torch.device("cpu")).options._timeout == \
        gloo_world._get_backend(torch.device("cpu")).options._timeout
    assert collective_group(serial) is serial  # already serial: used as is
    c10d = torch.ops._c10d_functional  # the traced collectives resolve it by name
    out = c10d.wait_tensor(c10d.all_gather_into_tensor(torch.arange(3.0), 1, serial.group_name))
    torch.testing.assert_close(out, torch.arange(3.0))


def test_engine_traces_collectives_on_the_serial_group(gloo_world):
    import lazy_mlir
    import lazy_mlir.zero as zero
    from lazy_mlir.models import GPTConfig, make_adamw, make_gpt

    lazy_mlir.init(progress=False)
    model = make_gpt(GPTConfig(n_layer=1, n_head=2, n_embd=36, vocab_size=50, block_size=8, batch_size=2))
    model, _ = zero.initialize(model.to("lazy"), make_adamw(model), stage=1)
    engine = model._lazy_mlir_zero
    assert _threads(dist.distributed_c10d._resolve_process_group(engine.group_name)) == 1


def _tiny_gpt():
    from lazy_mlir.models import GPTConfig, make_gpt
    return make_gpt(GPTConfig(n_layer=1, n_head=2, n_embd=36, vocab_size=50, block_size=8, batch_size=2))


def test_eager_collectives_take_tensors_where_the_backend_works(gloo_world, monkeypatch):
    assert collective_device(gloo_world) == torch.device("cpu")
    # NCCL takes only CUDA tensors; a mixed default group serves CPU tensors with gloo.
    for backend, device in (("nccl", "cuda"), ("cpu:gloo,cuda:nccl", "cpu"), ("lazy_mlir_gloo", "cpu")):
        monkeypatch.setattr(dist, "get_backend", lambda group=None, b=backend: b)
        assert collective_device(gloo_world) == torch.device(device), backend


def test_engine_hands_its_eager_collectives_the_groups_device(lazy_level, gloo_world, monkeypatch):
    import lazy_mlir.zero as zero
    from lazy_mlir.models import make_adamw
    from lazy_mlir.zero.engine import ZeroEngine

    devices = []
    for name in ("broadcast", "all_gather_into_tensor", "all_reduce"):
        def spy(*args, _real=getattr(dist, name), _name=name, **kwargs):
            devices.append((_name, {t.device.type for t in args if isinstance(t, torch.Tensor)}))
            return _real(*args, **kwargs)
        monkeypatch.setattr(dist, name, spy)
    model = _tiny_gpt()
    model, _ = zero.initialize(model.to("lazy"), make_adamw(model), stage=3)
    zero.full_state_dict(model)
    assert {name for name, _ in devices} == {"broadcast", "all_gather_into_tensor", "all_reduce"}
    assert all(seen == {"cpu"} for _, seen in devices), devices
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    engine = ZeroEngine(_tiny_gpt().to("lazy"), 3, gloo_world, 0, 0, 0, 0)
    assert engine.device == torch.device("cuda")
