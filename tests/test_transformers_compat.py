"""transformers sees lazy tensors as traced (lazy_mlir.trace.transformers_compat):
its mask decisions read no lazy value, whether it was imported before or
after lazy_mlir.init(). The zoo (tests/models) checks the models: BERT, T5
and BART with a padded 2-D mask in one graph execution per step."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import lazy_mlir
from lazy_mlir.observe import metrics

IS_TRACING = """
import torch, lazy_mlir
{before}
lazy_mlir.init("O0")
{after}
from transformers.utils.import_utils import is_tracing
from transformers import masking_utils
assert is_tracing(torch.zeros(2, device="lazy")), "a lazy tensor is not seen as traced"
assert masking_utils.is_tracing(torch.zeros(2, device="lazy"))
assert not is_tracing(torch.zeros(2)), "a CPU tensor is seen as traced"
"""


@pytest.mark.parametrize("imported", ["before_init", "after_init"])
def test_lazy_tensors_are_traced(imported):
    transformers = "import transformers.masking_utils"
    code = IS_TRACING.format(before=transformers if imported == "before_init" else "",
                             after=transformers if imported == "after_init" else "")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_padded_mask_reads_no_value(lazy_level):
    """BERT with the 2-D padding mask users pass: without the patch,
    masking_utils reads ``padding_mask.all()``, a second graph execution."""
    import torch.nn.functional as F
    from transformers import BertConfig, BertForMaskedLM
    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                     max_position_embeddings=16, vocab_size=32, pad_token_id=0, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    model = BertForMaskedLM._from_config(cfg, attn_implementation="sdpa").double()
    ids = torch.randint(1, 32, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0

    def loss_of(m, device):
        return F.cross_entropy(m(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.flatten(0, 1),
                               ids.to(device).flatten())

    expected = loss_of(model, "cpu")
    model.to("lazy")
    metrics.reset()
    loss = loss_of(model, "lazy")
    torch._lazy.mark_step()
    s = metrics.snapshot()
    assert s["syncs"] == {} and s["graph_executions"] == s["mark_steps"] == 1, metrics.report()
    torch.testing.assert_close(loss.cpu(), expected, rtol=1e-12, atol=0)
