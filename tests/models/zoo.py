"""The model zoo: tiny Hugging Face transformers and torchvision-style CNNs,
random init (no hub downloads), with their inputs, loss and optimizer.

A ``Variant`` names one configuration: model, attention implementation
(HF's ``attn_implementation``; None for CNNs), dropout probability, first
length (tokens, or the image side for vision models) and size: the tests
train "tiny" models, where per-step overhead dominates;
``benchmarks/models.py --size base`` runs the same models at a size where
matrix products and convolutions dominate, as in real training. ``batches()``
gives ``steps`` full batches, one ragged batch (batch size 1, the way a data
loader ends an epoch), then one full batch at the model's other length. Losses are computed here from the logits, in the
model's dtype (HF's own loss casts logits to fp32, which would hide fp64).
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from cnns import MobileNetV3Small, ResNet  # noqa: E402

VOCAB, BATCH, CLASSES = 64, 2, 10  # the tiny size's vocabulary and batch


@dataclass(frozen=True)
class Size:
    """The dimensions a size gives every model (the tiny size's are the
    zoo's original configs: the tests' compiles and tolerances rest on them)."""
    layers: int
    hidden: int
    heads: int      # twice as many for Llama (half of them key/value heads), T5 and BART
    ffn: int
    vocab: int
    batch: int
    patch: int      # ViT's patch side
    cnn_width: int  # the CNNs' channels, times this


SIZES = {"tiny": Size(layers=1, hidden=32, heads=2, ffn=64, vocab=VOCAB, batch=BATCH, patch=4, cnn_width=1),
         "base": Size(layers=4, hidden=256, heads=4, ffn=1024, vocab=1024, batch=8, patch=8, cnn_width=8),
         # as deep as BERT-base, narrow (benchmarks/layer_groups.py: a deep model's cold compile)
         "deep": Size(layers=12, hidden=128, heads=4, ffn=512, vocab=1024, batch=4, patch=8, cnn_width=4)}


@dataclass(frozen=True)
class Variant:
    model: str
    attn: str | None = "sdpa"
    dropout: float = 0.0
    length: int = 8
    size: str = "tiny"

    @property
    def id(self) -> str:
        attn = f"-{self.attn}" if self.attn else ""
        size = "" if self.size == "tiny" else f"-{self.size}"
        return f"{self.model}{attn}-p{self.dropout:g}{size}"

    @property
    def dims(self) -> Size:
        return SIZES[self.size]

    @property
    def other_length(self) -> int:
        return next(n for n in SPECS[self.model].lengths if n != self.length)


@dataclass(frozen=True)
class Spec:
    build: Callable[[Variant], torch.nn.Module]
    inputs: Callable[[Variant, int, torch.Generator], tuple]  # (variant, batch, gen) -> CPU tensors
    loss: Callable[..., torch.Tensor]                          # (model, *inputs) -> scalar
    optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer]
    attns: tuple = ("sdpa", "eager")
    dropouts: tuple = (0.0, 0.1)
    lengths: tuple = (8, 16)  # at the tiny size
    base_length: int = 128    # the first length at other sizes
    third_length: int | None = None  # a length after both: the generic code of the second serves it


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def sgd_momentum(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _hf(model_cls, config, v: Variant):
    return model_cls._from_config(config, attn_implementation=v.attn)


# ------------------------------------------------------------- transformers
def _gpt2(v):
    from transformers import GPT2Config, GPT2LMHeadModel
    d = v.dims
    cfg = GPT2Config(n_layer=d.layers, n_embd=d.hidden, n_head=d.heads, n_positions=_positions(v),
                     vocab_size=d.vocab, bos_token_id=0,
                     eos_token_id=0, resid_pdrop=v.dropout, embd_pdrop=v.dropout, attn_pdrop=v.dropout)
    return _hf(GPT2LMHeadModel, cfg, v)


def _llama(v):
    from transformers import LlamaConfig, LlamaForCausalLM
    d = v.dims
    cfg = LlamaConfig(num_hidden_layers=d.layers, hidden_size=d.hidden, intermediate_size=d.ffn,
                      num_attention_heads=2 * d.heads, num_key_value_heads=d.heads,
                      max_position_embeddings=_positions(v), vocab_size=d.vocab, bos_token_id=0,
                      eos_token_id=0, pad_token_id=0, attention_dropout=v.dropout)
    return _hf(LlamaForCausalLM, cfg, v)


def _positions(v) -> int:
    """Position embeddings past both lengths of the variant's size (a full slice
    of the table would trace another op at the second length)."""
    return max(32, 2 * v.length)


def _tokens(v, batch, g):
    return (torch.randint(1, v.dims.vocab, (batch, v.length), generator=g),)


def _causal_lm_loss(model, ids):
    logits = model(input_ids=ids).logits
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def _padding_mask(v, batch):
    """Row 0 full, the others padded at the end: a real padded batch, as the
    2-D 0/1 mask users pass. transformers decides from its values whether a
    mask can be dropped; lazy_mlir.trace.transformers_compat makes it treat lazy
    tensors as traced, so that decision reads no value (no second graph)."""
    mask = torch.ones(batch, v.length, dtype=torch.long)
    mask[1:, v.length - 3:] = 0
    return mask


def _bert(v):
    from transformers import BertConfig, BertForMaskedLM
    d = v.dims
    cfg = BertConfig(num_hidden_layers=d.layers, hidden_size=d.hidden, intermediate_size=d.ffn,
                     num_attention_heads=d.heads, max_position_embeddings=_positions(v), vocab_size=d.vocab,
                     pad_token_id=0,
                     hidden_dropout_prob=v.dropout, attention_probs_dropout_prob=v.dropout)
    return _hf(BertForMaskedLM, cfg, v)


def _bert_inputs(v, batch, g):
    ids = torch.randint(1, v.dims.vocab, (batch, v.length), generator=g)
    targets = torch.randint(1, v.dims.vocab, (batch, v.length), generator=g)
    return ids, _padding_mask(v, batch), targets


def _bert_loss(model, ids, mask, targets):
    logits = model(input_ids=ids, attention_mask=mask).logits
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _t5(v):
    from transformers import T5Config, T5ForConditionalGeneration
    d = v.dims
    cfg = T5Config(num_layers=d.layers, num_decoder_layers=d.layers, d_model=d.hidden,
                   d_kv=d.hidden // (2 * d.heads), num_heads=2 * d.heads, d_ff=d.ffn, vocab_size=d.vocab,
                   relative_attention_num_buckets=8 if v.size == "tiny" else 32,
                   relative_attention_max_distance=16 if v.size == "tiny" else 128,
                   dropout_rate=v.dropout, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    return _hf(T5ForConditionalGeneration, cfg, v)


def _t5_inputs(v, batch, g):
    ids = torch.randint(2, v.dims.vocab, (batch, v.length), generator=g)
    labels = torch.randint(2, v.dims.vocab, (batch, v.length // 2), generator=g)
    return ids, _padding_mask(v, batch), labels


def _t5_loss(model, ids, mask, labels):
    # decoder inputs: labels shifted right behind decoder_start_token_id (what HF does for labels=)
    decoder_ids = torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], dim=1)
    logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _bart(v):
    from transformers import BartConfig, BartForConditionalGeneration
    d = v.dims
    cfg = BartConfig(d_model=d.hidden, encoder_layers=d.layers, decoder_layers=d.layers,
                     encoder_attention_heads=2 * d.heads, decoder_attention_heads=2 * d.heads, encoder_ffn_dim=d.ffn,
                     decoder_ffn_dim=d.ffn, max_position_embeddings=_positions(v), vocab_size=d.vocab,
                     dropout=v.dropout, attention_dropout=v.dropout, activation_dropout=v.dropout,
                     pad_token_id=0, bos_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    return _hf(BartForConditionalGeneration, cfg, v)


def _vit(v):
    from transformers import ViTConfig, ViTForImageClassification
    d = v.dims
    cfg = ViTConfig(image_size=v.length, patch_size=d.patch, num_channels=3, hidden_size=d.hidden,
                    num_hidden_layers=d.layers, num_attention_heads=d.heads, intermediate_size=d.ffn,
                    num_labels=CLASSES,
                    hidden_dropout_prob=v.dropout, attention_probs_dropout_prob=v.dropout)
    return _hf(ViTForImageClassification, cfg, v)


def _images(v, batch, g):
    return torch.randn(batch, 3, v.length, v.length, generator=g), torch.randint(0, CLASSES, (batch,), generator=g)


def _vit_loss(model, images, labels):
    # other image sizes than the config's interpolate the position embeddings
    logits = model(pixel_values=images, interpolate_pos_encoding=images.shape[-1] != model.config.image_size).logits
    return F.cross_entropy(logits, labels)


# ------------------------------------------------- the wider zoo (zoo_full)
# Architectures beside the ones above, each with what sets it apart: one
# variant each (dropout on), trained by ``pytest tests/models -m zoo_full``.
def _config(v: Variant, config_cls: str, model_cls: str, **fields):
    import transformers
    return _hf(getattr(transformers, model_cls), getattr(transformers, config_cls)(**fields), v)


def _decoder_fields(v, **fields):
    """A Llama-family decoder: grouped-query attention (twice the query heads)."""
    d = v.dims
    return dict(num_hidden_layers=d.layers, hidden_size=d.hidden, intermediate_size=d.ffn,
                num_attention_heads=2 * d.heads, num_key_value_heads=d.heads,
                max_position_embeddings=_positions(v), vocab_size=d.vocab, bos_token_id=0, eos_token_id=0,
                pad_token_id=0, attention_dropout=v.dropout, **fields)


def _encoder_fields(v, **fields):
    """A BERT-style encoder's dimensions and dropouts."""
    d = v.dims
    return dict(num_hidden_layers=d.layers, hidden_size=d.hidden, intermediate_size=d.ffn,
                num_attention_heads=d.heads, max_position_embeddings=_positions(v), vocab_size=d.vocab,
                hidden_dropout_prob=v.dropout, attention_probs_dropout_prob=v.dropout, **fields)


def _qwen2(v):  # biases on q, k, v only
    return _config(v, "Qwen2Config", "Qwen2ForCausalLM", **_decoder_fields(v))


def _mistral(v):  # a sliding window shorter than the sequence: another mask
    return _config(v, "MistralConfig", "MistralForCausalLM", **_decoder_fields(v, sliding_window=v.length // 2))


def _gemma(v):  # GeGLU, embeddings scaled by sqrt(hidden), RMSNorm's (1 + weight)
    d = v.dims
    return _config(v, "GemmaConfig", "GemmaForCausalLM", **_decoder_fields(v, head_dim=d.hidden // (2 * d.heads)))


def _mixtral(v):
    # Mixture of experts: top-2 of 4 experts per token. transformers'
    # default grouped_mm experts need float32 or bfloat16 (aten's CPU
    # kernel): in float64 the batched form, each token's experts gathered
    # (tests/test_lazy_kernels.py covers the grouped products).
    return _config(v, "MixtralConfig", "MixtralForCausalLM",
                   **_decoder_fields(v, num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.0,
                                     experts_implementation="batched_mm"))


def _phi3(v):  # fused qkv and gate/up projections
    return _config(v, "Phi3Config", "Phi3ForCausalLM",
                   **_decoder_fields(v, resid_pdrop=v.dropout, embd_pdrop=v.dropout))


def _gpt_neox(v):  # parallel residual, rotary on a quarter of each head
    d = v.dims
    return _config(v, "GPTNeoXConfig", "GPTNeoXForCausalLM", num_hidden_layers=d.layers, hidden_size=d.hidden,
                   intermediate_size=d.ffn, num_attention_heads=d.heads, max_position_embeddings=_positions(v),
                   vocab_size=d.vocab, bos_token_id=0, eos_token_id=0, attention_dropout=v.dropout,
                   hidden_dropout=v.dropout)


def _falcon(v):  # multi-query: one key/value head split out of a fused qkv, parallel attention, rotary
    d = v.dims
    return _config(v, "FalconConfig", "FalconForCausalLM", num_hidden_layers=d.layers, hidden_size=d.hidden,
                   num_attention_heads=2 * d.heads, multi_query=True, parallel_attn=True,
                   new_decoder_architecture=False, bias=False, alibi=False, max_position_embeddings=_positions(v),
                   vocab_size=d.vocab, bos_token_id=0, eos_token_id=0, attention_dropout=v.dropout,
                   hidden_dropout=v.dropout)


def _gpt_bigcode(v):  # multi-query: one key/value head in a fused c_attn, split by sizes
    d = v.dims
    return _config(v, "GPTBigCodeConfig", "GPTBigCodeForCausalLM", n_layer=d.layers, n_embd=d.hidden,
                   n_head=2 * d.heads, n_inner=d.ffn, multi_query=True, n_positions=_positions(v), vocab_size=d.vocab,
                   bos_token_id=0, eos_token_id=0, resid_pdrop=v.dropout, embd_pdrop=v.dropout,
                   attn_pdrop=v.dropout)


def _bloom(v):  # ALiBi position biases, fused qkv viewed per head, softmax in fp32
    d = v.dims
    return _config(v, "BloomConfig", "BloomForCausalLM", n_layer=d.layers, hidden_size=d.hidden, n_head=d.heads,
                   vocab_size=d.vocab, bos_token_id=0, eos_token_id=0, hidden_dropout=v.dropout,
                   attention_dropout=v.dropout)


def _gptj(v):  # rotary on interleaved pairs (rotate_every_two), parallel attention and MLP
    d = v.dims
    return _config(v, "GPTJConfig", "GPTJForCausalLM", n_layer=d.layers, n_embd=d.hidden, n_head=d.heads,
                   rotary_dim=d.hidden // d.heads // 2, n_positions=_positions(v), vocab_size=d.vocab,
                   bos_token_id=0, eos_token_id=0, resid_pdrop=v.dropout, embd_pdrop=v.dropout,
                   attn_pdrop=v.dropout)


def _stablelm(v):  # partial rotary, LayerNorm, grouped-query attention
    return _config(v, "StableLmConfig", "StableLmForCausalLM",
                   **_decoder_fields(v, partial_rotary_factor=0.5, hidden_dropout=v.dropout))


def _starcoder2(v):  # grouped-query attention with biases, a sliding window, LayerNorm
    return _config(v, "Starcoder2Config", "Starcoder2ForCausalLM",
                   **_decoder_fields(v, sliding_window=v.length // 2, residual_dropout=v.dropout,
                                     embedding_dropout=v.dropout))


def _opt(v):  # learned positions offset by 2, computed from the mask's cumsum
    d = v.dims
    return _config(v, "OPTConfig", "OPTForCausalLM", num_hidden_layers=d.layers, hidden_size=d.hidden, ffn_dim=d.ffn,
                   num_attention_heads=d.heads, max_position_embeddings=_positions(v), word_embed_proj_dim=d.hidden,
                   vocab_size=d.vocab, bos_token_id=0, eos_token_id=0, pad_token_id=0, dropout=v.dropout,
                   attention_dropout=v.dropout)


def _distilbert(v):
    d = v.dims
    return _config(v, "DistilBertConfig", "DistilBertForMaskedLM", n_layers=d.layers, dim=d.hidden,
                   hidden_dim=d.ffn, n_heads=d.heads, max_position_embeddings=_positions(v), vocab_size=d.vocab,
                   pad_token_id=0, dropout=v.dropout, attention_dropout=v.dropout)


def _roberta(v):  # positions from the ids' cumsum past the padding token (1; ids draw it too)
    return _config(v, "RobertaConfig", "RobertaForMaskedLM",
                   **{**_encoder_fields(v), "max_position_embeddings": _positions(v) + 2}, pad_token_id=1)


def _electra(v):  # embeddings narrower than the hidden size, projected up
    return _config(v, "ElectraConfig", "ElectraForMaskedLM", **_encoder_fields(v, embedding_size=v.dims.hidden // 2),
                   pad_token_id=0)


def _deberta_v2(v):  # disentangled attention over log-bucketed relative positions
    return _config(v, "DebertaV2Config", "DebertaV2ForMaskedLM",
                   **_encoder_fields(v, relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8,
                                     norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False),
                   pad_token_id=0)


def _albert(v):  # one layer's weights shared by every layer
    return _config(v, "AlbertConfig", "AlbertForMaskedLM",
                   **_encoder_fields(v, embedding_size=v.dims.hidden // 2, classifier_dropout_prob=v.dropout),
                   pad_token_id=0)


def _mt5(v):  # T5 with gated GELU and untied embeddings
    d = v.dims
    return _config(v, "MT5Config", "MT5ForConditionalGeneration", num_layers=d.layers, num_decoder_layers=d.layers,
                   d_model=d.hidden, d_kv=d.hidden // (2 * d.heads), num_heads=2 * d.heads, d_ff=d.ffn,
                   vocab_size=d.vocab, relative_attention_num_buckets=8 if v.size == "tiny" else 32,
                   relative_attention_max_distance=16 if v.size == "tiny" else 128, dropout_rate=v.dropout,
                   pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)


def _vision_fields(v):
    return dict(image_size=v.length, num_channels=3, num_labels=CLASSES)


def _deit(v):  # a distillation token beside the class token
    d = v.dims
    return _config(v, "DeiTConfig", "DeiTForImageClassification", **_vision_fields(v), patch_size=d.patch,
                   hidden_size=d.hidden, num_hidden_layers=d.layers, num_attention_heads=d.heads,
                   intermediate_size=d.ffn, hidden_dropout_prob=v.dropout, attention_probs_dropout_prob=v.dropout)


def _swin(v):  # shifted windows (roll, window masks), patch merging, stochastic depth
    d = v.dims
    return _config(v, "SwinConfig", "SwinForImageClassification", **_vision_fields(v), patch_size=d.patch,
                   embed_dim=d.hidden // 2, depths=[d.layers, d.layers], num_heads=[d.heads, 2 * d.heads],
                   window_size=4, mlp_ratio=d.ffn / d.hidden, hidden_dropout_prob=v.dropout,
                   attention_probs_dropout_prob=v.dropout, drop_path_rate=v.dropout)


def _convnext(v):  # depthwise 7x7 convolutions, channels-last LayerNorm, layer scale, stochastic depth
    w, d = v.dims.cnn_width, v.dims
    # layer scale from 1, not HF's 1e-6: a dropped block then changes the loss
    return _config(v, "ConvNextConfig", "ConvNextForImageClassification", **_vision_fields(v), num_stages=2,
                   hidden_sizes=[8 * w, 16 * w], depths=[d.layers, d.layers], drop_path_rate=v.dropout,
                   layer_scale_init_value=1.0)


def _resnet_hf(v):
    w, d = v.dims.cnn_width, v.dims
    return _config(v, "ResNetConfig", "ResNetForImageClassification", **_vision_fields(v), embedding_size=8 * w,
                   hidden_sizes=[8 * w, 16 * w], depths=[d.layers, d.layers], layer_type="basic")


def _pixels_loss(model, images, labels):
    return F.cross_entropy(model(pixel_values=images).logits, labels)


# --------------------------------------------------------------------- CNNs
def _cnn_loss(model, images, labels):
    return F.cross_entropy(model(images), labels)


SPECS: dict[str, Spec] = {
    "gpt2": Spec(_gpt2, _tokens, _causal_lm_loss, adamw, third_length=12),
    "bert": Spec(_bert, _bert_inputs, _bert_loss, adamw),
    "llama": Spec(_llama, _tokens, _causal_lm_loss, adamw),
    "t5": Spec(_t5, _t5_inputs, _t5_loss, adamw),
    # BART's decoder makes its own mask of ones on the inputs' device (lazy)
    "bart": Spec(_bart, _t5_inputs, _t5_loss, adamw),
    "vit": Spec(_vit, _images, _vit_loss, adamw, lengths=(16, 24), base_length=64),
    "resnet": Spec(lambda v: ResNet(widths=(8 * v.dims.cnn_width, 16 * v.dims.cnn_width)), _images, _cnn_loss,
                   sgd_momentum, attns=(None,), dropouts=(0.0,), lengths=(32, 24), base_length=64),
    "mobilenet": Spec(lambda v: MobileNetV3Small(dropout=v.dropout, width=v.dims.cnn_width), _images, _cnn_loss,
                      sgd_momentum, attns=(None,), dropouts=(0.0, 0.2), lengths=(32, 24), base_length=64),
}
_ONE = dict(attns=("sdpa",), dropouts=(0.1,))  # the wider zoo: one variant each
SPECS.update({
    "qwen2": Spec(_qwen2, _tokens, _causal_lm_loss, adamw, **_ONE),
    "mistral": Spec(_mistral, _tokens, _causal_lm_loss, adamw, **_ONE),
    "gemma": Spec(_gemma, _tokens, _causal_lm_loss, adamw, **_ONE),
    "phi3": Spec(_phi3, _tokens, _causal_lm_loss, adamw, **_ONE),
    "mixtral": Spec(_mixtral, _tokens, _causal_lm_loss, adamw, **_ONE),
    "gpt_neox": Spec(_gpt_neox, _tokens, _causal_lm_loss, adamw, **_ONE),
    "falcon": Spec(_falcon, _tokens, _causal_lm_loss, adamw, **_ONE),
    "gpt_bigcode": Spec(_gpt_bigcode, _tokens, _causal_lm_loss, adamw, **_ONE),
    "bloom": Spec(_bloom, _tokens, _causal_lm_loss, adamw, **{**_ONE, "attns": ("eager",)}),
    "gptj": Spec(_gptj, _tokens, _causal_lm_loss, adamw, **{**_ONE, "attns": ("eager",)}),
    "stablelm": Spec(_stablelm, _tokens, _causal_lm_loss, adamw, **_ONE),
    "starcoder2": Spec(_starcoder2, _tokens, _causal_lm_loss, adamw, **_ONE),
    "opt": Spec(_opt, _tokens, _causal_lm_loss, adamw, **_ONE),
    "distilbert": Spec(_distilbert, _bert_inputs, _bert_loss, adamw, **_ONE),
    "roberta": Spec(_roberta, _bert_inputs, _bert_loss, adamw, **_ONE),
    "electra": Spec(_electra, _bert_inputs, _bert_loss, adamw, **_ONE),
    "deberta_v2": Spec(_deberta_v2, _bert_inputs, _bert_loss, adamw, **{**_ONE, "attns": ("eager",)}),  # no SDPA in HF
    "albert": Spec(_albert, _bert_inputs, _bert_loss, adamw, **_ONE),
    "mt5": Spec(_mt5, _t5_inputs, _t5_loss, adamw, **_ONE),
    "deit": Spec(_deit, _images, _vit_loss, adamw, lengths=(16, 24), base_length=64, **_ONE),
    # HF Swin fails eagerly at 24 pixels (a 3x3 grid under a 4x4 window)
    "swin": Spec(_swin, _images, _pixels_loss, adamw, lengths=(32, 48), base_length=64, **_ONE),
    "convnext": Spec(_convnext, _images, _pixels_loss, adamw, **{**_ONE, "attns": (None,)}, lengths=(32, 24),
                     base_length=64),
    "resnet_hf": Spec(_resnet_hf, _images, _pixels_loss, sgd_momentum, attns=(None,), dropouts=(0.0,),
                      lengths=(32, 24), base_length=64),
})


def all_variants() -> list[Variant]:
    """The full cartesian product: every model x attention x dropout (each
    run trains both lengths)."""
    return [Variant(name, a, p, spec.lengths[0]) for name, spec in SPECS.items()
            for a, p in itertools.product(spec.attns, spec.dropouts)]


def base_variant(name: str, **changes) -> Variant:
    spec = SPECS[name]
    tiny = changes.get("size", "tiny") == "tiny"
    fields = dict(model=name, attn=spec.attns[0], dropout=spec.dropouts[0],
                  length=spec.lengths[0] if tiny else spec.base_length)
    return Variant(**{**fields, **changes})


def make_model(v: Variant, dtype=torch.float64, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return SPECS[v.model].build(v).to(dtype)


def batches(v: Variant, steps: int, dtype=torch.float64, seed: int = 1) -> list[tuple]:
    """``steps`` full batches (the size's batch), a ragged batch of 1, a
    full batch at the other length, and one at the third where the spec
    has one."""
    g = torch.Generator().manual_seed(seed)
    inputs = SPECS[v.model].inputs
    third = SPECS[v.model].third_length
    full = v.dims.batch
    out = [inputs(v, b, g) for b in [full] * steps + [1]] + [
        inputs(dataclasses.replace(v, length=n), full, g) for n in (v.other_length, third) if n]
    return [tuple(t.to(dtype) if t.is_floating_point() else t for t in batch) for batch in out]
