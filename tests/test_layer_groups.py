"""A fusion group per repeated layer (lazy_mlir.cluster.layer_groups, lazy_backend/core/layer_regions.h).

A model that skips layers at random (LayerDrop) traces another step graph
at each skip pattern. With a group per layer, each new pattern's groups are
the ones already compiled: the step lowers and clusters again (a graph
compile) but generates no code.
"""
import warnings

import pytest
import torch
import torch.nn as nn

import lazy_mlir
from lazy_mlir.cluster import layer_groups
from lazy_mlir.observe import metrics
from helpers import CPU, LAZY, assert_compiled, assert_same_training, hf_step, train


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class LayerDropNet(nn.Module):
    """Blocks skipped with probability ``layerdrop``, decided on the host by
    torch.rand as Hugging Face's encoders do."""

    def __init__(self, width=24, depth=4, layerdrop=0.4):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(8, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 3)
        self.layerdrop = layerdrop
        self.patterns = []  # the layers each forward ran

    def forward(self, x, y):
        h = self.embed(x)
        ran = []
        for i, layer in enumerate(self.layers):
            if self.training and torch.rand([]) < self.layerdrop:
                continue
            h = layer(h)
            ran.append(i)
        self.patterns.append(tuple(ran))
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1), y.flatten())


def _batches(steps):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(2, 5, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (2, 5), generator=g))
            for _ in range(steps)]


def _train(device, steps, after_step=None, **model_args):
    """(losses, parameters) as helpers.train gives them, and the model."""
    models = []

    def make():
        models.append(LayerDropNet(**model_args).double())
        return models[-1]

    torch.manual_seed(11)  # the skip patterns
    result = train(make, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2), _batches(steps), device,
                   after_step=after_step)
    return result, models[0]


@pytest.fixture
def layers_marked():
    lazy_mlir.init("O1", layer_groups="on")
    metrics.reset()
    yield
    lazy_mlir.init("O1")


@pytest.mark.compiles_in_step("counts each skip pattern's compiles and generated code in its own step")
def test_a_new_skip_pattern_compiles_no_group(layers_marked):
    """Once every layer has run (its first update makes its optimizer state:
    other code), a new skip pattern is a new step graph whose groups are all
    compiled already."""
    steps = 10
    eager, _ = _train(CPU, steps)
    snapshots = []
    lazy, model = _train(LAZY, steps, after_step=lambda i: snapshots.append(metrics.snapshot()))
    assert_same_training(eager, lazy, rtol=1e-9, atol=1e-10)
    patterns = model.patterns
    seen, all_ran = set(), None
    for i, pattern in enumerate(patterns):
        seen.update(pattern)
        if all_ran is None and len(seen) == 4:
            all_ran = i
    assert all_ran is not None and all_ran < steps - 3, patterns
    later = snapshots[all_ran], snapshots[-1]
    new_patterns = set(patterns[all_ran + 1:]) - set(patterns[:all_ran + 1])
    # the later steps traced new graphs, and compiled no group for them
    assert new_patterns and later[1]["compiles"] > later[0]["compiles"], (patterns, metrics.report())
    assert later[1]["group_cache_misses"] == later[0]["group_cache_misses"], (patterns, metrics.report())
    # within the first step already, the blocks shared code: hits
    assert snapshots[0]["group_cache_hits"] > 0, metrics.report()
    assert_compiled(later[1])


def test_blocks_found_and_layerdrop_detected():
    model = LayerDropNet()
    assert layer_groups.repeated_layers(model) == [model.layers]
    from transformers import M2M100Config, M2M100Model
    tiny = dict(vocab_size=16, d_model=8, encoder_layers=2, decoder_layers=2, encoder_attention_heads=1,
                decoder_attention_heads=1, encoder_ffn_dim=8, decoder_ffn_dim=8, max_position_embeddings=8)
    assert layer_groups.skips_layers(M2M100Model(M2M100Config(**tiny, encoder_layerdrop=0.05)))
    assert not layer_groups.skips_layers(M2M100Model(M2M100Config(**tiny, encoder_layerdrop=0.0, decoder_layerdrop=0.0)))


def test_o2_keeps_one_group():
    """O2 compiles the whole step as one group, layers marked or not."""
    lazy_mlir.init("O2", layer_groups="on")
    try:
        metrics.reset()
        _train(LAZY, 1, depth=2, layerdrop=0.0)
        s = metrics.snapshot()
    finally:
        lazy_mlir.init("O1")
    assert list(s["groups_per_graph"].values()) == [1], metrics.report()


def _m2m100_config(**changes):
    from transformers import M2M100Config
    return M2M100Config(**{**dict(vocab_size=64, d_model=16, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                  decoder_ffn_dim=32, max_position_embeddings=32, encoder_layerdrop=0.5,
                                  decoder_layerdrop=0.5, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                                  pad_token_id=1, decoder_start_token_id=2), **changes})


def _train_m2m100(device, steps, patterns=None):
    """HF M2M100 (2+2 layers, LayerDrop 0.5, no dropout, AdamW, fp32); with
    ``patterns``, the layers each step ran are appended to it."""
    from transformers import M2M100ForConditionalGeneration

    config = _m2m100_config()
    torch.manual_seed(0)
    model = M2M100ForConditionalGeneration(config)
    ran = []
    if patterns is not None:
        layers = [*model.model.encoder.layers, *model.model.decoder.layers]
        for i, layer in enumerate(layers):
            layer.register_forward_pre_hook(lambda m, a, i=i: ran.append(i))
    model = model.to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(3, 64, (2, 8), generator=g).to(device), torch.randint(3, 64, (2, 6), generator=g).to(device)
    torch.manual_seed(SKIP_SEED)
    losses, snapshots = [], []
    for _ in range(steps):
        losses.append(hf_step(model, opt, device, input_ids=src, labels=tgt))
        if device.type == "lazy":
            snapshots.append(metrics.snapshot())
        if patterns is not None:
            patterns.append(tuple(ran))
            ran.clear()
    return losses, snapshots


SKIP_SEED = 138  # step 0 runs every layer; steps 1 and 2 skip one encoder layer each: two new patterns


@pytest.mark.compiles_in_step("counts each skip pattern's compiles and generated code in its own step")
def test_hf_layerdrop_compiles_its_layers_once(lazy_level):
    """Hugging Face M2M100 with its encoder's and decoder's LayerDrop, under
    the default layer_groups="auto": after the first step, new skip patterns
    compile no group."""
    patterns = []
    eager, _ = _train_m2m100(CPU, 3, patterns)
    assert patterns == [(0, 1, 2, 3), (0, 2, 3), (1, 2, 3)]
    metrics.reset()
    lazy, snapshots = _train_m2m100(LAZY, 3)
    assert lazy == pytest.approx(eager, rel=1e-5)  # fp32: Inductor's kernels round otherwise
    first, last = snapshots[0], snapshots[-1]
    assert last["compiles"] > first["compiles"], (patterns, metrics.report())
    assert last["group_cache_misses"] == first["group_cache_misses"], (patterns, metrics.report())
    assert_compiled(last)


@pytest.mark.parametrize("dropout", [0.1, 0.0])
def test_layerdrop_with_dropout_warns_that_masks_differ_from_eager(lazy_level, dropout):
    """LayerDrop's host draws fall between eager's dropout masks; the lazy
    step draws the masks after them, when it runs. The step's execution
    says so (host_generator.h), naming the user's mark_step, and only when
    the model has dropout (no lazy draw, nothing to differ)."""
    from transformers import M2M100ForConditionalGeneration
    torch.manual_seed(0)
    model = M2M100ForConditionalGeneration(_m2m100_config(dropout=dropout)).to(LAZY)
    ids = torch.randint(3, 64, (2, 8)).to(LAZY)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(input_ids=ids, labels=ids).loss.backward()
        torch._lazy.mark_step()
    differ = [w for w in caught if "differ from eager PyTorch's" in str(w.message)]
    assert metrics.snapshot()["draws_after_host_use"] == (1 if dropout else 0), metrics.report()
    assert len(differ) == (1 if dropout else 0), [str(w.message) for w in caught]
    if dropout:
        assert differ[0].filename == __file__  # the user's mark_step, not lazy_mlir's hook


def test_a_deep_model_left_whole_hints_at_layer_groups_once(lazy_level, capfd, monkeypatch):
    """"auto" leaves a model that keeps its layers whole; the first compile
    of one with DEEP_LAYERS or more says how to compile one layer for all
    of them, once per process (DEEP_LAYERS lowered to 2 here: an 8-layer
    step takes ~30 s to lower even with Inductor's cache warm)."""
    monkeypatch.setattr(layer_groups, "DEEP_LAYERS", 2)
    monkeypatch.setattr(layer_groups, "_deep_unmarked", 0)  # no earlier test's model counts
    monkeypatch.setattr(layer_groups, "_hinted", False)
    _train(LAZY, 1, depth=2, layerdrop=0.0, width=4)
    err = capfd.readouterr().err
    assert err.count("layer_groups='on'") == 1, err
    assert "its 2 repeated layers" in err
    layer_groups.print_compile_hint()
    assert "layer_groups='on'" not in capfd.readouterr().err  # said once
    s = metrics.snapshot()
    assert set(s["groups_per_graph"].values()) == {1}, metrics.report()  # the layers left in one group
    assert_compiled(s)
