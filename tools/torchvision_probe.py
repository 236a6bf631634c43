"""Trains torchvision's own models (code nobody here wrote) a few SGD steps
on the lazy device against eager, and says per model: the largest relative
loss difference and the largest first-step gradient difference (each
against eager's own: eager with its weights moved by a few ulps; and
against the same lazy trace run at O0 by TorchScript), graph executions
per step, the first step's seconds (its compile), whether its forward was
captured (the default) or why it ran op by op, and why a step did not run
generated code alone (a group left in TorchScript, an eager fallback).
Exits 1 when any model did not run one graph of generated code a step
captured, or when its gradients differ beyond the dtype's tolerance and
ten times eager's own difference.

torchvision is not a dependency: install the release for torch 2.13 beside
it without letting pip touch torch, e.g. into a folder of its own:

    .venv/bin/pip install --no-deps --target /tmp/tv torchvision==0.28.0 pillow
    PYTHONPATH=/tmp/tv .venv/bin/python tools/torchvision_probe.py [--dtype float64] [--models resnet18,swin_t]

torchvision 0.28 is built for CUDA torch only: on a CPU build its extension
(detection ops such as nms) does not load, and importing it fails while
registering their meta kernels. The models are plain Python and use none
of them, so that registration is skipped here when the extension is absent.

Batches of 2 train BatchNorm on few values: in float32, rounding differences
grow within three steps on some models (RegNet, ShuffleNet, GoogLeNet,
MnasNet); ``--dtype float64`` tells a real mismatch from that.
"""
from __future__ import annotations

import argparse
import copy
import glob
import importlib.util
import os
import statistics
import sys
import time
import types

import torch

# name -> builder arguments: dropout off where the builder takes it (stochastic
# depth is switched off on the built model, since some builders fix it)
MODELS = {
    "resnet18": {}, "mobilenet_v3_small": {"dropout": 0.0}, "efficientnet_b0": {"dropout": 0.0},
    "convnext_tiny": {}, "regnet_y_400mf": {}, "shufflenet_v2_x0_5": {}, "squeezenet1_1": {"dropout": 0.0},
    "densenet121": {}, "googlenet": {"aux_logits": False, "init_weights": True, "dropout": 0.0},
    "mnasnet0_5": {"dropout": 0.0}, "swin_t": {"dropout": 0.0}, "vit_b_32": {"dropout": 0.0, "image_size": 64},
    "efficientnet_v2_s": {"dropout": 0.0}, "alexnet": {"dropout": 0.0}, "wide_resnet50_2": {},
}
IMAGE_SIZE = {"alexnet": 96}  # its pooling needs more than 64 pixels


def _import_torchvision_models():
    package = importlib.util.find_spec("torchvision")  # the package found, not imported
    if package is None:
        raise SystemExit("torchvision is not installed: see this script's docstring")
    extension = [path for folder in package.submodule_search_locations for path in glob.glob(f"{folder}/_C*.so")]
    try:
        loads = bool(extension) and torch.ops.load_library(extension[0]) is None
    except OSError:
        loads = False
    if not loads:  # a CUDA build on CPU torch: its ops' meta kernels have no ops to go to
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
    import torchvision.models
    import torchvision.ops
    return torchvision.models, torchvision.ops.StochasticDepth


def _train(model, device, batches, metrics=None):
    """Losses, metrics snapshots, seconds per step, and the first step's
    gradients: SGD's momentum buffer after its first step is the gradient
    itself, read here without another graph execution."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses, snapshots, seconds, gradients = [], [], [], []
    for x, y in batches:
        start = time.perf_counter()
        if metrics:
            metrics.reset()
        loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if metrics:
            torch._lazy.mark_step()
            snapshots.append(metrics.snapshot())
        losses.append(loss.item())
        seconds.append(time.perf_counter() - start)
        if not gradients:
            gradients = [opt.state[p]["momentum_buffer"].to("cpu", copy=True) for p in model.parameters() if p in opt.state]
    return losses, snapshots, seconds, gradients


def _largest_gradient_difference(want: list, got: list) -> float:
    """The largest difference of a first-step gradient, relative to the
    model's largest gradient entry (a parameter whose gradient is rounding
    alone, as a bias before BatchNorm, is judged at the model's scale)."""
    scale = max(a.abs().max().item() for a in want)
    return max((a - b).abs().max().item() for a, b in zip(want, got)) / max(scale, 1e-30)


def _largest_loss_difference(want: list, got: list) -> float:
    return max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(want, got))


def _moved(model):
    """A copy of ``model`` with its parameters moved by a few units in their
    last place: how far rounding alone moves eager's own figures."""
    from lazy_mlir.run import numerics_check
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for p in moved.parameters():
            p.copy_(numerics_check.perturbed([p.detach()])[0])
    return moved


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--level", default="O1")
    args = parser.parse_args()
    models, stochastic_depth = _import_torchvision_models()
    import torch._lazy
    import lazy_mlir
    from lazy_mlir.observe import metrics
    from lazy_mlir.run import numerics_check
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    from harness import not_compiled  # the benchmarks' check: groups in TorchScript, eager fallbacks
    lazy_mlir.init(args.level)
    dtype = getattr(torch, args.dtype)
    failed = 0
    for name in args.models.split(","):
        torch.manual_seed(0)
        eager = models.get_model(name, weights=None, num_classes=10, **MODELS.get(name, {})).to(dtype).train()
        for module in eager.modules():
            if isinstance(module, stochastic_depth):
                module.p = 0.0
        lazy = copy.deepcopy(eager).to("lazy")
        at_o0 = copy.deepcopy(eager)  # untrained, for the O0 run
        g = torch.Generator().manual_seed(1)
        size = IMAGE_SIZE.get(name, 64)
        batches = [(torch.randn(2, 3, size, size, generator=g, dtype=dtype), torch.randint(0, 10, (2,), generator=g))
                   for _ in range(args.steps)]
        moved = _moved(eager)
        try:
            floor_losses, _, _, floor_grads = _train(moved, "cpu", batches)
            want, _, _, want_grads = _train(eager, "cpu", batches)
            got, snapshots, seconds, got_grads = _train(lazy, "lazy", batches, metrics)
            if args.level != "O0":  # the same lazy trace run by TorchScript: the reference of the compiled code
                lazy_mlir.init("O0")
                try:
                    o0, _, _, o0_grads = _train(at_o0.to("lazy"), "lazy", batches, metrics)
                finally:
                    lazy_mlir.init(args.level)
        except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
            print(f"{name:20s} FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            failed += 1
            continue
        rel, loss_floor = (_largest_loss_difference(want, losses) for losses in (got, floor_losses))
        executions = [s["graph_executions"] for s in snapshots]
        why = next((w for w in (not_compiled(s, args.level) for s in snapshots) if w), None)
        later = f"  later steps {statistics.median(seconds[1:]) * 1000:.0f} ms (median)" if len(seconds) > 1 else ""
        # captured by itself (the default), or why its forward ran op by op
        refusals = {m: w for s in snapshots for m, w in s["capture_refusals"].items()}
        captured = "  captured" if all(s["captured_calls"] for s in snapshots) else \
            f"  OP BY OP: {'; '.join(f'{m}: {w[:160]}' for m, w in refusals.items()) or 'not captured'}"
        grad, floor = (_largest_gradient_difference(want_grads, grads) for grads in (got_grads, floor_grads))
        o0_grad = 0.0 if args.level == "O0" else _largest_gradient_difference(o0_grads, got_grads)
        against_o0 = "" if args.level == "O0" else \
            f"  against O0: loss {_largest_loss_difference(o0, got):.1e} gradients {o0_grad:.1e}"
        print(f"{name:20s} loss rel diff {rel:.1e} (eager's {loss_floor:.1e})  first-step gradients rel diff {grad:.1e} "
              f"(eager's rounding floor {floor:.1e}){against_o0}  executions/step {executions}  "
              f"first step {seconds[0]:.0f} s" + later + captured + (f"  NOT COMPILED: {why}" if why else ""), flush=True)
        # the checker's rule: beyond the dtype's tolerance and ten times rounding's reach, from eager or from O0
        reach = max(numerics_check.NOISE_FACTOR * floor, numerics_check.TOLERANCES[dtype][0])
        beyond = max(grad, o0_grad) > reach
        if beyond:
            print(f"{name:20s} GRADIENTS BEYOND ROUNDING", flush=True)
        failed += any(e != 1 for e in executions) or why is not None or beyond or not captured.strip() == "captured"
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
