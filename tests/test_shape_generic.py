"""Shape-generic groups: a group seen at a second size compiles once with
symbolic sizes and serves later sizes; every serve is checked."""
import dataclasses
import os
import pickle
import sys

import pytest
import torch
import torch.nn as nn

import lazy_mlir
from lazy_mlir.cache import compile_cache
from lazy_mlir.cache.disk_cache import SUFFIX, decode
from lazy_mlir.compile import shape_generic
from lazy_mlir.compile.shape_generic import SizeExpr, explain
from lazy_mlir.observe import metrics
from helpers import LAZY, assert_compiled, assert_same_training, train, train_token_batches

# each new size's code is checked in the step that brings it (the background
# route, where the step runs TorchScript meanwhile, is test_background_compile's)
pytestmark = [pytest.mark.compiles_in_step("new sizes compile in their step"),
              pytest.mark.op_by_op("the per-op trace's sizes: automatic capture records the first size apart")]

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "models"))


@pytest.fixture
def fresh(lazy_level, monkeypatch):
    # no disk cache: every size must come from a compile or the generic code;
    # and no graph LTC cached from an earlier test (the zoo's GPT-2 at length
    # 16): a hit there compiles nothing, so its size is never seen
    monkeypatch.setattr(lazy_mlir.config.current, "cache", False)
    shape_generic.clear()
    lazy_mlir.native._C.clear_computation_cache()
    yield
    shape_generic.clear()


def test_explain_finds_the_simplest_expression():
    t, b = ((0, 1), [8, 16]), ((0, 0), [2, 3])
    assert explain([8, 16], [t]) == SizeExpr(((0, 1),))
    assert explain([14, 30], [t]) == SizeExpr(((0, 1),), scale=2, offset=-2)  # (T-1)*B, B=2 static
    # ... also where T is two inputs' dims (an attention mask's T x T): T*T//12 + 9
    # fits 8 -> 14 and 16 -> 30 too, but not T = 12 (22)
    assert explain([14, 30], [t, ((1, 3), [8, 16])]) == SizeExpr(((0, 1),), scale=2, offset=-2)
    assert explain([4, 8], [t]) == SizeExpr(((0, 1),), divisor=2)
    assert explain([16, 48], [b, t]) == SizeExpr(((0, 0), (0, 1)))  # B*T, both changed
    # every observation must fit: 8->8, 12->12 fits s, but not 20->14
    assert explain([8, 12, 14], [((0, 1), [8, 12, 20])]) is None
    expr = SizeExpr(((0, 0), (0, 1)), scale=2, offset=-1)
    assert expr.value([(3, 4)]) == 23 and str(expr) == "in0.size(0)*in0.size(1)*2-1"
    # three padded stride-2 convolutions give ceil(s/8): sizes 16 and 24 read
    # it as s//8; a third size (20 -> 3) tells the two apart
    assert explain([2, 3], [((0, 2), [16, 24])]) == SizeExpr(((0, 2),), divisor=8)
    ceiling = explain([2, 3, 3], [((0, 2), [16, 24, 20])])
    assert ceiling == SizeExpr(((0, 2),), divisor=8, shift=7) and str(ceiling) == "(in0.size(2)+7)//8"
    assert [ceiling.value_of(x) for x in (17, 28, 32, 33)] == [3, 4, 4, 5]
    # a ViT's tokens at image sizes 32 and 40 (patch 4): (H*W)//16 patches and the class token
    h, w = ((0, 2), [32, 40]), ((0, 3), [32, 40])
    assert explain([65, 101], [h, w]) == SizeExpr(((0, 2), (0, 3)), divisor=16, offset=1)
    # a causal LM's shifted logits flattened, a ragged batch of 1 and a
    # second length seen: B*(T-1), which no expression of B*T alone fits
    b, t = ((0, 0), [2, 1, 2]), ((0, 1), [8, 8, 16])
    shifted = explain([14, 7, 30], [b, t])
    assert shifted == SizeExpr(((0, 1),), offset=-1, times=((0, 0),)) and str(shifted) == "(in0.size(1)-1)*in0.size(0)"
    assert shifted.value([(3, 24)]) == 69
    # ConvNeXt's pixels after its 4x4 patch stem, flattened with the batch
    b, h, w = ((0, 0), [2, 1, 2]), ((0, 2), [32, 32, 24]), ((0, 3), [32, 32, 24])
    assert explain([128, 64, 72], [b, h, w]) == SizeExpr(((0, 0), (0, 2), (0, 3)), divisor=16)


class Tagger(nn.Module):
    """A token model whose step reshapes by batch and length (view sizes
    baked into the graph), with a slice bound that follows the length only
    up to ``cap`` (a constant the generic code cannot know). Each test uses
    its own ``width``: LTC keeps compiled graphs across tests by hash."""

    def __init__(self, width, cap=1000):
        super().__init__()
        self.emb, self.fc, self.cap = nn.Embedding(50, width), nn.Linear(width, width), cap

    def forward(self, ids):
        h = torch.relu(self.fc(self.emb(ids)))
        b, t, c = h.shape
        h = h[:, :min(t, self.cap)]
        return h.reshape(b * h.shape[1], c).softmax(-1).pow(2).mean()


class GatedShiftedTagger(Tagger):
    """Phi-3's fused gate/up projection (silu of half a chunk: a slice with
    gaps) and a causal LM's shifted tokens flattened with the batch
    (``B*(T-1)`` rows)."""

    def __init__(self, width):
        super().__init__(width)
        self.fc = nn.Linear(width, 2 * width)

    def forward(self, ids):
        gate, up = self.fc(self.emb(ids)).chunk(2, dim=-1)
        h = torch.nn.functional.silu(gate) * up
        b, t, c = h.shape
        return h[:, 1:].reshape(b * (t - 1), c).softmax(-1).pow(2).mean()


class ShiftedCappedTagger(Tagger):
    """A Tagger whose slice always starts at 1, so that LTC traces it at
    every length (a slice of all of ``h`` is no op)."""

    def forward(self, ids):
        h = torch.relu(self.fc(self.emb(ids)))
        b, t, c = h.shape
        h = h[:, 1:min(t, self.cap)]
        return h.reshape(b * h.shape[1], c).softmax(-1).pow(2).mean()


class BucketTagger(Tagger):
    """T5's relative positions: ``arange(T)`` takes the length as a scalar
    input, and the distance is clamped to a constant that equals the first
    length (LTC hands two equal scalars one data object)."""

    def __init__(self, width, clamp=8):
        super().__init__(width)
        self.clamp, self.bias = clamp, nn.Embedding(clamp + 1, width)

    def forward(self, ids):
        h = torch.relu(self.fc(self.emb(ids)))
        b, t, c = h.shape
        pos = torch.arange(t, dtype=torch.long, device=ids.device)
        distance = (pos[None, :] - pos[:, None]).abs().clamp(max=self.clamp)
        h = h + self.bias(distance).mean(1)
        return h.reshape(b * t, c).softmax(-1).pow(2).mean()


def _twins(cls=Tagger, **kw):
    """fp64 Taggers with the same weights: one on the CPU, one on the lazy device."""
    torch.manual_seed(0)
    model = cls(**kw).double()
    lazy_model = cls(**kw).double()
    lazy_model.load_state_dict(model.state_dict())
    return model, lazy_model.to(LAZY)


def _run_both(shapes, **kw):
    model, lazy_model = _twins(**kw)
    eager = train_token_batches(model, shapes, torch.device("cpu"))
    lazy = train_token_batches(lazy_model, shapes, LAZY)
    torch.testing.assert_close(lazy[0], eager[0], rtol=1e-12, atol=1e-12)
    for name, p in eager[1].items():
        torch.testing.assert_close(lazy[1][name], p, rtol=1e-12, atol=1e-12, msg=name)
    for s in lazy[2]:
        assert_compiled(s)
    return lazy[2]


def test_later_sizes_are_served_by_one_generic_compile(fresh):
    # steps 0-1 at the first size (step 0 differs: SGD's first step), then
    # a second length (generic compile), then lengths and a batch never seen.
    shapes = [(2, 8), (2, 8), (2, 12), (2, 16), (2, 5), (3, 8), (3, 20)]
    steps = _run_both(shapes, width=16)
    compiled = [s["generic_compiles"] for s in steps]
    served = [s["generic_hits"] for s in steps]
    assert compiled == [0, 0, 1, 0, 0, 1, 0], compiled  # the new batch size adds a symbol once
    assert served == [0, 0, 0, 1, 1, 0, 1], served
    assert all(s["generic_failed"] == 0 for s in steps)
    assert "1 sizes served" in metrics.report()


def test_a_gated_projection_and_shifted_tokens_compile_generic(fresh):
    # the ragged batch of 1 is specialised but seen: with the second length,
    # the flattened rows are B*(T-1), both varying
    steps = _run_both([(2, 8), (2, 8), (1, 8), (2, 12), (3, 16)], cls=GatedShiftedTagger, width=10)
    assert [s["generic_compiles"] for s in steps] == [0, 0, 0, 1, 0]
    assert [s["generic_hits"] for s in steps] == [0, 0, 0, 0, 1]
    assert all(s["generic_failed"] == 0 for s in steps)


def test_scalars_equal_at_one_length_compile_generic_at_the_next(fresh):
    # at length 8 the clamp and arange's end are both 8: one input, unless
    # each scalar gets its own data, which makes 12 another group family
    # (test_cpp_wrapper's baked slopes check that the guards still know the scalars' tensors)
    steps = _run_both([(2, 8), (2, 8), (2, 12), (2, 16)], cls=BucketTagger, width=18)
    assert [s["generic_compiles"] for s in steps] == [0, 0, 1, 0]
    assert [s["generic_hits"] for s in steps] == [0, 0, 0, 1]
    assert all(s["generic_failed"] == 0 for s in steps)


def test_sizes_the_generic_code_does_not_cover_compile_static(fresh):
    # batch 1 is specialised (as in Dynamo); past cap=14 the slice bound no
    # longer follows the length, so the serve check refuses the generic code.
    steps = _run_both([(2, 8), (2, 8), (2, 12), (1, 12), (2, 20)], width=12, cap=14)
    assert [s["generic_compiles"] for s in steps] == [0, 0, 1, 0, 0]
    assert [s["generic_hits"] for s in steps] == [0, 0, 0, 0, 0]
    assert steps[3]["group_cache_misses"] == 1 and steps[4]["group_cache_misses"] == 1
    # a static compile says why it is not generic (LAZY_MLIR_LOG=recompiles prints it)
    batch_of_one = steps[3]["recompiles"][0]
    assert "size 1 at dim 0 (0 and 1 are specialised" in batch_of_one["not_shape_generic"], batch_of_one


def test_a_static_compile_names_the_size_no_expression_gives(fresh):
    # past cap=14 the slice's end stops following the length: 8, 12, then 14 at 20
    steps = _run_both([(2, 8), (2, 8), (2, 12), (2, 20)], cls=ShiftedCappedTagger, width=14, cap=14)
    assert [s["generic_compiles"] for s in steps] == [0, 0, 1, 0]
    assert steps[3]["group_cache_misses"] == 1 and steps[3]["generic_hits"] == 0
    why = steps[3]["recompiles"][0]["not_shape_generic"]
    assert why.startswith("no expression of the sizes that changed gives the size constant used by aten::slice"), why
    assert "test_shape_generic.py" in why and why.endswith(": 8 -> 12 -> 14"), why


def _as_a_new_process():
    """What another process has: nothing in memory, the cache folder on disk."""
    shape_generic.clear()
    compile_cache.clear_memory()


@pytest.mark.python_wrapper
def test_generic_variants_serve_the_next_process_from_the_cache_folder(lazy_level, monkeypatch, tmp_path):
    monkeypatch.setattr(lazy_mlir.config.current, "cache_dir", str(tmp_path))
    _run_both([(2, 8), (2, 8), (2, 12)], width=28)  # stores the length-12 generic variants
    _as_a_new_process()
    # step 0 is the first-step graph (its static entry); then two lengths never compiled
    steps = _run_both([(2, 8), (2, 16), (2, 5)], width=28)
    assert [s["generic_compiles"] for s in steps] == [0, 0, 0]
    assert steps[1]["generic_disk_hits"] >= 1 and steps[2]["generic_disk_hits"] == 0, steps
    for s in steps[1:]:  # every group the static cache missed ran stored generic code
        assert s["generic_hits"] == s["group_cache_misses"] >= 1, s
        assert "ts_to_fx" not in s["stage_runs"] and "codegen" not in s["stage_runs"], s["stage_runs"]
    assert "variants read from disk" in metrics.report()

    # a damaged variant is removed with a warning and the group compiles instead
    _as_a_new_process()
    entries = [pickle.loads(decode(path.read_bytes())) for path in tmp_path.glob("*" + SUFFIX)]
    variants = [v["disk_key"] for e in entries for v in e.get("variants", ())]
    assert variants
    for key in variants:
        path = tmp_path / (key + SUFFIX)
        path.write_bytes(path.read_bytes()[:-7])
    with pytest.warns(RuntimeWarning, match="is unusable .*truncated"):
        steps = _run_both([(2, 8), (2, 20)], width=28)
    assert steps[1]["generic_disk_hits"] == 0 and steps[1]["group_cache_misses"] >= 1
    assert steps[1]["stage_runs"].get("ts_to_fx", 0) == steps[1]["group_cache_misses"]


def test_static_policy_compiles_every_size(fresh, monkeypatch):
    monkeypatch.setattr(lazy_mlir.config.current, "dynamic", "static")
    steps = _run_both([(2, 8), (2, 8), (2, 12), (2, 16)], width=8)
    assert sum(s["generic_compiles"] + s["generic_hits"] for s in steps) == 0
    assert [s["group_cache_misses"] for s in steps][2:] == [1, 1]


def test_a_failed_generic_compile_falls_back_to_the_static_form(fresh, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("injected generic failure")

    monkeypatch.setattr(shape_generic, "lower_group", broken)
    with pytest.warns(RuntimeWarning, match=r"could not be compiled shape-generic \(RuntimeError: injected"):
        steps = _run_both([(2, 8), (2, 8), (2, 12)], width=20)
    assert steps[2]["generic_failed"] == 1 and steps[2]["generic_compiles"] == 0
    assert steps[2]["group_cache_misses"] == 1  # compiled static; _run_both checked eager numerics


def _cross_entropies(n_small, n_large):
    """K-dim cross entropy (nll_loss2d) 'mean' and 'sum' at two batch sizes,
    lazily (one step each) and eagerly; the generic metrics of each step."""
    results = []
    for reduction, n in [("mean", n_small), ("mean", n_large), ("sum", n_small), ("sum", n_large)]:
        g = torch.Generator().manual_seed(n)
        logits, target = torch.randn(n, 11, 5, generator=g), torch.randint(0, 11, (n, 5), generator=g)
        metrics.reset()
        got = torch.nn.functional.cross_entropy(logits.to(LAZY), target.to(LAZY), reduction=reduction)
        torch._lazy.mark_step()
        want = torch.nn.functional.cross_entropy(logits, target, reduction=reduction)
        torch.testing.assert_close(got.cpu(), want, msg=f"reduction={reduction}, batch {n}")
        results.append(metrics.snapshot())
    return results


def test_generic_variants_at_the_same_sizes_keep_their_own_code_on_disk(lazy_level, tmp_path):
    # nll_loss's reduction (mean 1, sum 2) is an int constant, left out of the
    # family like the sizes: 'mean' at batch 26 compiles a variant that keeps
    # it, 'sum' at 26 (after 'mean' at 13) one that explains it as batch//13.
    # Both were compiled at the same sizes; stored under one entry, the next
    # process's 'mean' rewrote it and its 'sum' then ran the 'mean' code.
    options = dict(cache_dir=str(tmp_path), dynamic="auto", progress=False)
    lazy_mlir.init("O1", **options)
    cold = _cross_entropies(13, 26)
    assert [s["generic_compiles"] for s in cold] == [0, 1, 0, 1], cold
    for _ in range(2):  # the next process, and the one after it (each rewrote what the last stored)
        _as_a_new_process()
        marker = "aten::lazy_mlir_test_generic_disk_keys"
        lazy_mlir.compilable.deny(marker)  # a new classification generation: LTC hands its graphs over again
        lazy_mlir.compilable.DENIED.discard(marker)
        lazy_mlir.init("O1", **options)
        warm = _cross_entropies(13, 26)
        assert [s["generic_hits"] for s in warm] == [0, 1, 0, 1], warm  # each from its own stored code
        assert all(s["generic_compiles"] == 0 for s in warm), warm


def test_a_stored_variant_is_named_by_all_it_holds(tmp_path):
    # an index entry listing a variant under another key (an older lazy_mlir
    # named it by its sizes alone) is not served: the code there may be another's
    cfg = lazy_mlir.config.Config(cache_dir=str(tmp_path))
    variant = shape_generic.GenericGroup(None, [(6, 4)], [(4, 1)], {(0, 0)}, [SizeExpr(((0, 0),), divisor=3)], {},
                                         None, [])
    other = dataclasses.replace(variant, template=[2])
    shape_generic._store("family-x", variant, {"graph": b""}, cfg)
    shape_generic._store("family-x", other, {"graph": b""}, cfg)
    assert variant.disk_key != other.disk_key
    disk = compile_cache.disk_of(cfg)
    index = compile_cache.read_entry(disk, shape_generic._index_key("family-x"))
    assert [v["disk_key"] for v in index["variants"]] == [variant.disk_key, other.disk_key]
    index["variants"][0]["disk_key"] = other.disk_key  # listed under the other's entry
    disk.write(index["key"], pickle.dumps(index))
    shape_generic.clear()
    shape_generic._read_stored("family-x", cfg)
    assert [v.template for v in shape_generic._generic["family-x"]] == [[2]]
    shape_generic.clear()


class BatchNormNet(nn.Module):
    """A strided convolution, BatchNorm in training mode (its running
    variance scales by n/(n-1), a float of the image size; its
    num_batches_tracked counts steps) and a global pool: a CNN's step."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 5)

    def forward(self, x, y):
        h = torch.relu(self.bn(self.conv(x)))
        return nn.functional.cross_entropy(self.fc(h.mean((2, 3))), y)


def test_a_batchnorm_cnn_compiles_once_for_later_image_sizes(fresh):
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(2, 3, s, s, generator=g, dtype=torch.float64), torch.randint(0, 5, (2,), generator=g))
               for s in (16, 16, 24, 32)]
    models, steps = [], []

    def make():
        torch.manual_seed(0)
        models.append(BatchNormNet().double())
        return models[-1]

    def after_step(i):
        steps.append(metrics.snapshot())
        metrics.reset()

    def momentum(model):
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    eager = train(make, momentum, batches, torch.device("cpu"))
    metrics.reset()
    lazy = train(make, momentum, batches, LAZY, after_step=after_step)
    assert_same_training(eager, lazy, rtol=1e-12, atol=1e-12)
    for (name, want), got in zip(models[0].named_buffers(), models[1].buffers()):  # running stats, step count
        torch.testing.assert_close(got.cpu(), want, rtol=1e-12, atol=1e-12, msg=name)
    assert [s["generic_failed"] for s in steps] == [0, 0, 0, 0]
    assert [s["generic_compiles"] for s in steps] == [0, 0, 1, 0]
    assert [s["generic_hits"] for s in steps] == [0, 0, 0, 1]


class StridedNet(nn.Module):
    """Three padded stride-2 convolutions (a ResNet's stem and stages): the
    backward's size constants are ceil(s/8), ceil(s/4), ceil(s/2)."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(c, 4, 3, stride=2, padding=1) for c in (3, 4, 4))
        self.fc = nn.Linear(4, 5)

    def forward(self, x, y):
        for conv in self.convs:
            x = torch.relu(conv(x))
        return nn.functional.cross_entropy(self.fc(x.mean((2, 3))), y)


def _image_steps_like_eager(model_cls, sizes) -> dict[str, list]:
    """Trains ``model_cls`` (fp64, SGD) at each image size, lazily and
    eagerly; checks they match and that every step ran generated code;
    returns per-step counts of generic failures, compiles, hits and codegens."""
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(2, 3, s, s, generator=g, dtype=torch.float64), torch.randint(0, 5, (2,), generator=g))
               for s in sizes]
    steps = []

    def make():
        torch.manual_seed(0)
        return model_cls().double()

    def after_step(i):
        steps.append(metrics.snapshot())
        metrics.reset()

    def sgd(model):
        return torch.optim.SGD(model.parameters(), lr=0.1)

    eager = train(make, sgd, batches, torch.device("cpu"))
    metrics.reset()
    lazy = train(make, sgd, batches, LAZY, after_step=after_step)
    assert_same_training(eager, lazy, rtol=1e-12, atol=1e-12)
    for step in steps:
        assert_compiled(step)
    return {"failed": [t["generic_failed"] for t in steps], "generic": [t["generic_compiles"] for t in steps],
            "hits": [t["generic_hits"] for t in steps], "codegen": [t["stage_runs"].get("codegen", 0) for t in steps]}


@pytest.mark.python_wrapper
def test_a_strided_cnn_compiles_once_more_when_a_size_tells_ceiling_from_floor(fresh):
    """16 and 24 are divisible by 8, so the generic compile at 24 writes the
    constants as s//8; 20 gives ceil(20/8) = 3, which it does not admit: one
    more generic compile, with (s+7)//8, serves 28 and 17. Before the
    ceiling form, 20, 28 and 17 each compiled static."""
    counts = _image_steps_like_eager(StridedNet, (16, 16, 24, 20, 28, 17))
    assert counts == {"failed": [0] * 6, "generic": [0, 0, 1, 1, 0, 0], "hits": [0, 0, 0, 0, 1, 1],
                      "codegen": [1, 0, 1, 1, 0, 0]}  # 28, 17: nothing compiled


class InterpolatedPositions(nn.Module):
    """A ViT's patch embedding and its position grid interpolated (bicubic)
    to the image's patch grid, with a class token: HF's
    interpolate_pos_encoding at another image size."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 8, 4, stride=4)
        self.pos = nn.Parameter(torch.randn(1, 8, 4, 4))
        self.cls = nn.Parameter(torch.randn(1, 1, 8))
        self.fc = nn.Linear(8, 5)

    def forward(self, x, y):
        h = self.patch(x)
        pos = nn.functional.interpolate(self.pos, size=h.shape[-2:], mode="bicubic", align_corners=False)
        tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), (h + pos).flatten(2).transpose(1, 2)], 1)
        return nn.functional.cross_entropy(self.fc(tokens.softmax(-1).mean(1)), y)


@pytest.mark.python_wrapper
def test_interpolated_position_embeddings_compile_once_for_later_image_sizes(fresh):
    """Two failures kept a ViT at other image sizes static: the bicubic
    upsampling's backward had no meta kernel for symbolic sizes (the
    generic compile failed), and its token count H*W//16 + 1 had no
    expression. 24 then 36 compile generic once; 44 and 52 are served. (LTC
    passes equal integer scalars as one input, another graph: sizes whose
    patch grid is 4 or 8, the position grid's size or the width, would
    start a family of their own.)"""
    counts = _image_steps_like_eager(InterpolatedPositions, (24, 24, 36, 44, 52))
    assert counts == {"failed": [0] * 5, "generic": [0, 0, 1, 0, 0], "hits": [0, 0, 0, 1, 1],
                      "codegen": [1, 0, 1, 0, 0]}


def test_an_op_without_symbolic_shapes_compiles_static_without_a_warning(fresh, recwarn):
    # torch has no meta kernel for geqrf: its group cannot be generic, which
    # is said in the recompile record, not warned as a failed compile
    for a in (torch.randn(2, 6, 3), torch.randn(3, 7, 2), torch.randn(4, 5, 2)):
        metrics.reset()
        q, tau = torch.geqrf(a.to(LAZY))
        torch._lazy.mark_step()
        torch.testing.assert_close((q.cpu(), tau.cpu()), torch.geqrf(a))
        assert_compiled()
    s = metrics.snapshot()
    assert s["generic_failed"] == 0 and s["generic_compiles"] == 0, metrics.report()
    why = s["recompiles"][0]["not_shape_generic"]
    assert why.startswith("aten::geqrf at ") and why.endswith("has no shape function for symbolic sizes"), why
    assert not [w for w in recwarn if "shape-generic" in str(w.message)], [str(w.message) for w in recwarn]
