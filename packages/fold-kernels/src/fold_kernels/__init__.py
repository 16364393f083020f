"""fold-kernels: portable Triton kernels for AlphaFold-style models.

EvoAttention (forward + backward with the pair-bias gradient), LayerNorm (and its fork, whose
backward sums the residual stream's gradient; and AF3's adaptive LayerNorm), Linear (bias gradient
as a deterministic column sum), fused LayerNorm+Linear, SwiGLU, the AF2 gating fusions, the gated
projections of triangle multiplication (and their channel-first GEMM, cuBLAS with a channel-last
input gradient; and the whole update as one autograd node), fused softmax with mask and bias,
and fused Adam+EMA over flat buffers. Each op has a plain PyTorch twin: its reference in the op
contract, :mod:`fold_ops.reference` (the optimizer's in :mod:`fold_kernels.reference`).

Triton decides when a kernel is defined (at import) whether it runs compiled or in its CPU
interpreter: set ``TRITON_INTERPRET=1`` before importing this package to run on CPU tensors.
"""

from __future__ import annotations

from fold_kernels.adaptive_layer_norm import adaptive_layer_norm
from fold_kernels.channel_first import linear_channel_first
from fold_kernels.elementwise import bias_dropout_residual, bias_sigmoid_gate
from fold_kernels.evo_attention import evo_attention, evo_attention_packed
from fold_kernels.fused_linear import layer_norm_linear, swiglu
from fold_kernels.layer_norm import layer_norm, layer_norm_fork, layer_norm_pair_bias
from fold_kernels.linear import linear
from fold_kernels.optim import clip_coefficient, fused_adam_ema_, global_grad_norm, swa_decay
from fold_kernels.softmax import softmax_mask_bias
from fold_kernels.triangle_gate import triangle_projection_gate
from fold_kernels.triangle_gemm import triangle_projection
from fold_kernels.triangle_multiplication import triangle_multiplication

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "linear",
    "evo_attention",
    "evo_attention_packed",
    "layer_norm",
    "layer_norm_fork",
    "layer_norm_pair_bias",
    "layer_norm_linear",
    "adaptive_layer_norm",
    "swiglu",
    "bias_sigmoid_gate",
    "bias_dropout_residual",
    "triangle_projection_gate",
    "triangle_projection",
    "triangle_multiplication",
    "linear_channel_first",
    "softmax_mask_bias",
    "fused_adam_ema_",
    "global_grad_norm",
    "clip_coefficient",
    "swa_decay",
]
