"""``torch.autocast("lazy")``: mixed precision on the lazy device.

torch refused ``device_type="lazy"`` ("unsupported autocast device_type"),
and ``torch.is_autocast_enabled("lazy")`` raised, which transformers calls
in the forwards of models that turn autocast off around a float32 island
(GPT-2 with ``reorder_and_upcast_attn``, Nemotron's LayerNorm1P, Decision
Transformer): those failed on the lazy device with autocast unused.
Nor did ``torch.autocast("cpu")`` help: its kernels cast CPU tensors only,
so a lazy model under it ran in float32.

The casts are C++ kernels on a dispatch key of their own
(``lazy_backend/kernels/lazy_autocast.h``), above autograd as torch's are, with
torch's policy for each op: the table of the device behind the lazy one
(``CPU_POLICIES`` or ``CUDA_POLICIES``, taken from torch 2.13's
registrations; a test checks them against the dispatcher), and its default
lower precision (bfloat16 behind a CPU, float16 behind a GPU). This module
makes torch's own autocast functions answer for "lazy": ``torch.autocast``,
``torch.is_autocast_enabled`` and the rest, so ``with
torch.autocast("lazy", dtype=torch.bfloat16):``, transformers' own
autocast regions and ``torch.utils.checkpoint``'s recompute (which enters
the forward's autocast state again) work as on CUDA.

Not done: the cast cache (torch's autocast casts a float32 weight once per
region; here each use traces its own cast, which the compiled graph shares
anyway).
"""
from __future__ import annotations

import functools

import torch
import torch.amp.autocast_mode

from ..native import _C

LOWER, FP32, FP32_OUT, FP32_APPEND, PROMOTE, BANNED = (
    "lower_precision_fp", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype", "promote", "banned")


def _table(**groups: str) -> dict[str, str]:
    """``policy=" op op.overload ..."`` -> {"aten::op": policy, ...}."""
    return {f"aten::{op}": policy for policy, ops in groups.items() for op in ops.split()}


# torch 2.13's AutocastCPU kernels (aten/src/ATen/autocast_mode.cpp).
CPU_POLICIES = _table(
    lower_precision_fp="""
        conv1d conv1d.padding conv2d conv2d.padding conv3d conv3d.padding bmm mm linalg_vecdot baddbmm
        addmm _addmm_activation addbmm linear _convolution.deprecated matmul conv_tbc mkldnn_rnn_layer
        conv_transpose1d conv_transpose2d.input conv_transpose3d.input prelu scaled_dot_product_attention
        _native_multi_head_attention""",
    fp32="""
        avg_pool3d binary_cross_entropy grid_sampler polar prod prod.dim_int quantile quantile.scalar
        nanquantile nanquantile.scalar stft stft.center cdist grid_sampler_2d _grid_sampler_2d_cpu_fallback
        grid_sampler_3d trace view_as_complex cholesky cholesky_inverse cholesky_solve inverse lu_solve
        orgqr ormqr pinverse max_pool3d max_unpool2d max_unpool3d adaptive_avg_pool3d reflection_pad1d
        reflection_pad2d replication_pad1d replication_pad2d replication_pad3d mse_loss
        cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss poisson_nll_loss smooth_l1_loss
        cross_entropy_loss l1_loss huber_loss margin_ranking_loss soft_margin_loss triplet_margin_loss
        multi_margin_loss ctc_loss.IntList ctc_loss.Tensor kl_div multilabel_margin_loss
        binary_cross_entropy_with_logits fft_fft fft_ifft fft_fft2 fft_ifft2 fft_fftn fft_ifftn fft_rfft
        fft_irfft fft_rfft2 fft_irfft2 fft_rfftn fft_irfftn fft_hfft fft_ihfft linalg_cond linalg_cond.p_str
        linalg_matrix_rank linalg_matrix_rank.tol_tensor linalg_matrix_rank.atol_rtol_tensor
        linalg_matrix_rank.atol_rtol_float linalg_solve linalg_cholesky linalg_svdvals linalg_eigvals
        linalg_eigvalsh linalg_inv linalg_householder_product linalg_tensorinv linalg_tensorsolve
        fake_quantize_per_tensor_affine geqrf _lu_with_info qr svd triangular_solve fractional_max_pool2d
        fractional_max_pool3d adaptive_max_pool3d multilabel_margin_loss_forward linalg_qr
        linalg_cholesky_ex linalg_svd linalg_eig linalg_eigh linalg_lstsq linalg_inv_ex""",
    promote="stack cat index_copy",
)

# torch 2.13's AutocastCUDA kernels (autocast_mode.h's AT_FORALL_* lists).
CUDA_POLICIES = _table(
    lower_precision_fp="""
        _convolution _convolution.deprecated conv1d conv2d conv3d conv_tbc conv_transpose1d
        conv_transpose2d.input conv_transpose3d.input convolution cudnn_convolution
        cudnn_convolution_transpose prelu addmm addmv addr matmul einsum mm mv linalg_vecdot linear addbmm
        baddbmm bmm chain_matmul linalg_multi_dot _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell
        gru_cell rnn_tanh_cell rnn_relu_cell _scaled_dot_product_flash_attention
        scaled_dot_product_attention""",
    fp32="""
        acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow.Tensor_Scalar
        pow.Tensor_Tensor pow.Scalar softplus layer_norm native_layer_norm rms_norm group_norm
        frobenius_norm.dim nuclear_norm nuclear_norm.dim cosine_similarity poisson_nll_loss
        cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss smooth_l1_loss
        huber_loss mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss triplet_margin_loss
        multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp
        upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d _upsample_nearest_exact2d
        upsample_nearest3d _upsample_nearest_exact3d upsample_linear1d upsample_bilinear2d
        _upsample_bilinear2d_aa upsample_trilinear3d upsample_bicubic2d _upsample_bicubic2d_aa""",
    fp32_set_opt_dtype="""
        prod prod.dim_int softmax.int log_softmax.int cumprod cumsum linalg_vector_norm linalg_matrix_norm
        linalg_matrix_norm.str_ord sum sum.dim_IntList""",
    fp32_append_dtype="norm.Scalar norm.ScalarOpt_dim",
    promote="addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add",
    banned="binary_cross_entropy",
)


def install(backing: str) -> None:
    """Registers the cast kernels for the device behind the lazy one (once
    per process: init() fixes that device) and makes torch's autocast
    functions answer for "lazy"."""
    _C.register_lazy_autocast(sorted((CUDA_POLICIES if backing == "cuda" else CPU_POLICIES).items()))
    _C.set_lazy_autocast_default_dtype(torch.float16 if backing == "cuda" else torch.bfloat16)
    _answer_for_lazy()


def state() -> tuple[bool, torch.dtype]:
    """This thread's lazy autocast state (part of a capture's record key)."""
    return _C.lazy_autocast_enabled(), _C.lazy_autocast_dtype()


def _device_argument(args, kwargs) -> object:
    return args[0] if args else kwargs.get("device_type")


def _answering_for_lazy(torch_function, lazy_function):
    """``torch_function`` with a "lazy" first argument answered by ``lazy_function``."""
    if getattr(torch_function, "_lazy_mlir_autocast", False):
        return torch_function

    @functools.wraps(torch_function)
    def answer(*args, **kwargs):
        if _device_argument(args, kwargs) == "lazy":
            rest = list(args[1:]) + [v for k, v in kwargs.items() if k != "device_type"]
            return lazy_function(*rest)
        return torch_function(*args, **kwargs)

    answer._lazy_mlir_autocast = True
    return answer


def _answer_for_lazy() -> None:
    # torch.autocast's __init__/__enter__/__exit__ and torch.utils.checkpoint
    # look these up at call time, as torch.<name> or torch.amp.<name>
    torch.is_autocast_enabled = _answering_for_lazy(torch.is_autocast_enabled, _C.lazy_autocast_enabled)
    torch.set_autocast_enabled = _answering_for_lazy(torch.set_autocast_enabled, _C.set_lazy_autocast_enabled)
    torch.get_autocast_dtype = _answering_for_lazy(torch.get_autocast_dtype, _C.lazy_autocast_dtype)
    torch.set_autocast_dtype = _answering_for_lazy(torch.set_autocast_dtype, _C.set_lazy_autocast_dtype)
    available = _answering_for_lazy(torch.amp.autocast_mode.is_autocast_available, lambda: True)
    torch.amp.autocast_mode.is_autocast_available = available
    torch.amp.is_autocast_available = available
