"""Two model families whose steps use ops with data-dependent sizes, written
here the way their libraries write them, with batches whose counts change.

- ``CtcModel``: a speech-style encoder (1-D convolution, GRU-free so tiny)
  trained with the CTC loss. ``ctc_loss_step`` flattens its labels as Hugging
  Face's Wav2Vec2ForCTC does (``labels.masked_select(labels >= 0)``, -100
  padding); ``ctc_loss_step_padded`` hands the padded (N, S) targets to the
  loss, which needs no flattening.
- ``wav2vec2_ctc``: Hugging Face's Wav2Vec2ForCTC itself (tiny, random
  init), whose loss flattens its labels so; it also checks its labels
  against the vocabulary with a value read of its own (``labels.max()``).
- ``Gcn``: a two-layer graph convolution over an edge list, as PyTorch
  Geometric's GCNConv computes it: self-loops removed by a boolean mask
  (``edge_index[:, src != dst]``) and added back, degrees by ``index_add``,
  messages gathered with ``index_select`` and summed with ``index_add``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

FEATURES, CLASSES, FRAMES, BATCH = 8, 6, 12, 3  # CTC: CLASSES includes the blank (0)
NODES, NODE_FEATURES, EDGES = 10, 5, 24


class CtcModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(FEATURES, 16, kernel_size=3, padding=1)
        self.head = torch.nn.Linear(16, CLASSES)

    def forward(self, features):  # (N, FEATURES, T) -> log-probabilities (T, N, CLASSES)
        hidden = F.gelu(self.conv(features)).transpose(1, 2)
        return self.head(hidden).log_softmax(-1).transpose(0, 1)


def ctc_batches(steps: int, seed: int = 0):
    """(features, labels padded with -100, input lengths): target lengths
    (and so their total) change from batch to batch."""
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        features = torch.randn(BATCH, FEATURES, FRAMES, generator=g, dtype=torch.float64)
        lengths = torch.randint(1, 5, (BATCH,), generator=g)
        labels = torch.randint(1, CLASSES, (BATCH, 4), generator=g)
        labels[torch.arange(4) >= lengths[:, None]] = -100
        input_lengths = torch.full((BATCH,), FRAMES) - torch.randint(0, 3, (BATCH,), generator=g)
        yield features, labels, input_lengths


def ctc_loss_step(model, features, labels, input_lengths):
    """Wav2Vec2ForCTC's loss: targets flattened by a boolean mask."""
    log_probs = model(features)
    mask = labels >= 0
    target_lengths = mask.sum(-1)
    flat = labels.masked_select(mask)
    return F.ctc_loss(log_probs, flat, input_lengths, target_lengths, blank=0, zero_infinity=True)


def ctc_loss_step_padded(model, features, labels, input_lengths):
    """The same loss on the padded (N, S) targets: no data-dependent size."""
    log_probs = model(features)
    target_lengths = (labels >= 0).sum(-1)
    return F.ctc_loss(log_probs, labels.clamp(min=0), input_lengths, target_lengths, blank=0, zero_infinity=True)


def wav2vec2_ctc():
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC
    cfg = Wav2Vec2Config(vocab_size=CLASSES, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
                         num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2, feat_extract_norm="group",
                         hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0,
                         final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0, ctc_zero_infinity=True,
                         pad_token_id=0, ctc_loss_reduction="mean")
    return Wav2Vec2ForCTC(cfg)


def audio_batches(steps: int, seed: int = 0):
    """(raw audio, labels padded with -100): 400 samples give 39 frames."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        audio = torch.randn(2, 400, generator=g, dtype=torch.float64)
        lengths = torch.randint(1, 6, (2,), generator=g)
        labels = torch.randint(1, CLASSES, (2, 6), generator=g)
        labels[torch.arange(6) >= lengths[:, None]] = -100
        yield audio, labels


def wav2vec2_loss_step(model, audio, labels):
    return model(audio, labels=labels).loss


class GcnLayer(torch.nn.Module):
    def __init__(self, features_in, features_out):
        super().__init__()
        self.linear = torch.nn.Linear(features_in, features_out)

    def forward(self, x, edge_index):
        src, dst = edge_index[0], edge_index[1]
        keep = src != dst
        edge_index = edge_index[:, keep]  # remove self-loops (a boolean index)
        loops = torch.arange(x.shape[0], device=x.device)
        src = torch.cat([edge_index[0], loops])
        dst = torch.cat([edge_index[1], loops])
        degree = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device).index_add(
            0, dst, torch.ones_like(dst, dtype=x.dtype))
        norm = degree.rsqrt()
        weight = norm.index_select(0, src) * norm.index_select(0, dst)
        messages = self.linear(x).index_select(0, src) * weight[:, None]
        return torch.zeros(x.shape[0], messages.shape[1], dtype=x.dtype, device=x.device).index_add(0, dst, messages)


class Gcn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = GcnLayer(NODE_FEATURES, 16)
        self.second = GcnLayer(16, CLASSES)

    def forward(self, x, edge_index):
        return self.second(F.relu(self.first(x, edge_index)), edge_index)


def graph_batches(steps: int, seed: int = 0):
    """(node features, edge list, node labels): random edges, some of them
    self-loops, so the count the mask keeps changes from batch to batch."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(NODES, NODE_FEATURES, generator=g, dtype=torch.float64)
        edge_index = torch.randint(0, NODES, (2, EDGES), generator=g)
        labels = torch.randint(0, CLASSES, (NODES,), generator=g)
        yield x, edge_index, labels


def gcn_loss_step(model, x, edge_index, labels):
    return F.cross_entropy(model(x, edge_index), labels)
