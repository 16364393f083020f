"""The triangle multiplicative update (AF2 Alg. 11/12, AF3 Alg. 12/13) as one autograd node.

fold-model's layer composes it from ops (the input LayerNorm's fork, the projection GEMM, the
gate, the product over k, the output LayerNorm, two output projections and the output gate):
about a dozen autograd nodes with the views between them, each a share of the host time of
an eager training step (the eager step at N 256 on an H200 takes several times its kernels'
time). Here the same ops' Functions run as :mod:`fold_kernels.steps` of one Function: the same
kernels and cuBLAS calls in the same order, the same values bit for bit, one node.

Shapes: ``z [*, I, J, C]``, ``mask [*, I, J]``; channel-first ``a, b, x [*, c, I, J]``.
"""

from __future__ import annotations

import torch
from fold_ops.autocast import lower, projection_dtype

from fold_kernels import nograd, steps, tuning
from fold_kernels.channel_first import _LinearChannelFirst
from fold_kernels.elementwise import _BiasSigmoidGate
from fold_kernels.layer_norm import _LayerNorm, _LayerNormFork, check_layer_norm
from fold_kernels.triangle_gate import _TriangleProjectionGate

__all__ = ["triangle_multiplication", "parameter_shapes", "PARAMETERS"]

# the parameters after z and mask, in the op's order
PARAMETERS = ("ln_in_weight", "ln_in_bias", "proj_weight", "proj_bias", "gate_weight",
              "gate_bias", "ln_out_weight", "ln_out_bias", "out_weight", "out_bias")


def parameter_shapes(n_c: int, c: int) -> tuple[tuple[int, ...], ...]:
    """The shapes of :data:`PARAMETERS` for ``C_z = n_c`` and ``c`` hidden channels."""
    return ((n_c,), (n_c,), (4 * c, n_c), (4 * c,), (n_c, n_c), (n_c,), (c,), (c,), (n_c, c),
            (n_c,))


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x [*, C]`` -> ``[M, C]`` (a view: x is contiguous here)."""
    return x.view(-1, x.shape[-1])


def _linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` for a contiguous ``x [*, C]``: ``[*, O]``, one GEMM."""
    return _rows(x).mm(weight.t()).view(*x.shape[:-1], weight.shape[0])


class _TriangleMultiplication(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, mask, ln_in_w, ln_in_b, proj_w, proj_b, gate_w, gate_b, ln_out_w,
                ln_out_b, out_w, out_b, outgoing, eps):
        # without autograd (nograd.apply) nothing is saved for a backward
        need = ctx.needs_input_grad if nograd.saves(ctx) else (False,) * 14
        fork = steps.Step((need[0], need[2], need[3]))
        _, z_ln = _LayerNormFork.forward(fork, z, ln_in_w, ln_in_b, eps, 1,
                                         projection_dtype(z))  # [*, I, J, C]
        project = steps.Step((True, need[4]))
        proj = _LinearChannelFirst.forward(project, z_ln, proj_w)  # [*, 4c, I, J]
        gate_in = steps.Step((True, need[5], False))
        a, b = _TriangleProjectionGate.forward(gate_in, proj, proj_b, mask)  # [*, c, I, J]
        x = a @ b.mT if outgoing else a.mT @ b  # [*, c, I, J]
        norm_out = steps.Step((True, need[8], need[9]))
        # LayerNorm reads the channel-first product through its strides: no copy
        x_ln = _LayerNorm.forward(norm_out, x.movedim(-3, -1), ln_out_w, ln_out_b, eps)
        x_out = _linear(x_ln, out_w)  # [*, I, J, C]
        g = _linear(z_ln, gate_w)  # [*, I, J, C]
        gate_out = steps.Step((True, True, need[7], need[11]))
        update = _BiasSigmoidGate.forward(gate_out, x_out, g, gate_b, out_b)
        steps.save(ctx, (fork, project, gate_in, norm_out, gate_out), a, b, x_ln, out_w, gate_w)
        ctx.outgoing = outgoing
        ctx.set_materialize_grads(False)  # an unread z passed on: its gradient is None
        return update, z

    @staticmethod
    def backward(ctx, d_update, d_z):
        if d_update is None:  # only the passed-on z was read
            return (d_z,) + (None,) * 13
        try:
            return _TriangleMultiplication._backward(ctx, d_update, d_z)
        finally:
            steps.release(ctx)

    @staticmethod
    def _backward(ctx, d_update, d_z):
        a, b, x_ln, out_w, gate_w = steps.restore(ctx)
        fork, project, gate_in, norm_out, gate_out = ctx.steps
        need = ctx.needs_input_grad
        d_x_out, d_g, d_gate_b, d_out_b = _BiasSigmoidGate.backward(gate_out, d_update)
        z_ln_rows = project.saved_tensors[0]  # [M, C]: the projection's saved input
        d_g_rows, d_x_out_rows = _rows(d_g), _rows(d_x_out)  # [M, C] each
        d_gate_w = d_g_rows.t().mm(z_ln_rows) if need[6] else None  # [C, C]
        d_z_ln_gate = d_g_rows.mm(gate_w)  # [M, C]
        d_out_w = d_x_out_rows.t().mm(_rows(x_ln)) if need[10] else None  # [C, c]
        d_x_ln = d_x_out_rows.mm(out_w).view(x_ln.shape)  # [*, I, J, c]
        d_x, d_ln_out_w, d_ln_out_b = _LayerNorm.backward(norm_out, d_x_ln)[:3]
        d_x = d_x.movedim(-1, -3)  # [*, c, I, J]
        # each gradient one product written in its operand's layout (as fold-model's
        # triangle_product)
        if ctx.outgoing:  # a [*, c, I, K], b [*, c, J, K]
            d_a, d_b = d_x @ b, d_x.mT @ a
        else:  # a [*, c, K, I], b [*, c, K, J]
            d_a, d_b = b @ d_x.mT, a @ d_x
        d_proj, d_proj_b, _ = _TriangleProjectionGate.backward(gate_in, d_a, d_b)
        d_z_ln, d_proj_w = _LinearChannelFirst.backward(project, d_proj)
        d_z, d_ln_in_w, d_ln_in_b = _LayerNormFork.backward(
            fork, d_z, d_z_ln, d_z_ln_gate.view(d_z_ln.shape))[:3]
        return (d_z, None, d_ln_in_w, d_ln_in_b, d_proj_w, d_proj_b, d_gate_w, d_gate_b,
                d_ln_out_w, d_ln_out_b, d_out_w, d_out_b, None, None)


def triangle_multiplication(z: torch.Tensor, mask: torch.Tensor, ln_in_weight: torch.Tensor,
                            ln_in_bias: torch.Tensor, proj_weight: torch.Tensor,
                            proj_bias: torch.Tensor, gate_weight: torch.Tensor,
                            gate_bias: torch.Tensor, ln_out_weight: torch.Tensor,
                            ln_out_bias: torch.Tensor, out_weight: torch.Tensor,
                            out_bias: torch.Tensor, outgoing: bool, eps: float = 1e-5
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(update, z)``: :func:`fold_ops.reference.triangle_multiplication` as one autograd node
    (module doc), with the values of fold-model's layer composed from fold-kernels' ops.

    Args:
        z: ``[*, I, J, C]`` (fp32, bf16 or fp16; fp32 under autocast: the projections then run
            in the autocast dtype, as the dispatcher lowers them in the composed layer).
        mask: ``[*, I, J]`` (broadcasts to z's batch dims), bool or float; no gradient.
        ln_in_weight, ln_in_bias: ``[C]``; proj_weight ``[4c, C]`` (rows ``W_pa, W_ga, W_pb,
            W_gb``), proj_bias ``[4c]``; gate_weight ``[C, C]``, gate_bias ``[C]``;
            ln_out_weight, ln_out_bias ``[c]``; out_weight ``[C, c]``, out_bias ``[C]``.
        outgoing: ``x_ij = sum_k a_ik b_jk`` (Alg. 11), else ``sum_k a_ki b_kj`` (Alg. 12).

    Returns:
        the update ``[*, I, J, C]`` in the projections' dtype, and z passed on (its gradient is
        added in the input LayerNorm's backward pass).
    """
    if z.dim() < 3:
        raise ValueError(f"triangle_multiplication: z must be [*, I, J, C], got {tuple(z.shape)}")
    n_c = z.shape[-1]
    check_layer_norm(z, ln_in_weight, ln_in_bias)
    if proj_weight.dim() != 2 or proj_weight.shape[0] % 4 or proj_weight.shape[1] != n_c:
        raise ValueError(f"triangle_multiplication: proj_weight must be [4c, C={n_c}], got "
                         f"{tuple(proj_weight.shape)}")
    params = (ln_in_weight, ln_in_bias, proj_weight, proj_bias, gate_weight, gate_bias,
              ln_out_weight, ln_out_bias, out_weight, out_bias)
    for name, t, shape in zip(PARAMETERS, params,
                              parameter_shapes(n_c, proj_weight.shape[0] // 4), strict=True):
        if tuple(t.shape) != shape:
            raise ValueError(f"triangle_multiplication: {name} must be {list(shape)}, got "
                             f"{list(t.shape)}")
    if tuple(mask.shape[-2:]) != tuple(z.shape[-3:-1]) or mask.dim() > z.dim() - 1:
        raise ValueError(f"triangle_multiplication: mask must be [*, I, J] = "
                         f"[*, {z.shape[-3]}, {z.shape[-2]}], got {tuple(mask.shape)}")
    tuning.require_device("triangle_multiplication", z,
                          "fold_ops.reference.triangle_multiplication")
    # the projections' operands as the dispatcher lowers them for the composed layer
    # (autocast: the autocast dtype; otherwise unchanged)
    (proj_weight, proj_bias, mask, gate_weight, out_weight), _ = lower(
        (proj_weight, proj_bias, mask, gate_weight, out_weight), {})
    dtype = projection_dtype(z)
    for name, w in (("proj_weight", proj_weight), ("gate_weight", gate_weight),
                    ("out_weight", out_weight)):
        if w.dtype != dtype:
            raise ValueError(f"triangle_multiplication: {name} must be in {dtype} (z's dtype, "
                             f"or the autocast dtype), got {w.dtype}")
    return nograd.apply(
        _TriangleMultiplication, z, mask, ln_in_weight, ln_in_bias, proj_weight.contiguous(),
        proj_bias, gate_weight, gate_bias, ln_out_weight, ln_out_bias, out_weight, out_bias,
        outgoing, eps)
