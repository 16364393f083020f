"""Triangle multiplicative update (AF2 supplement 1.6.5, Alg. 11-12; AF3 Alg. 12-13): each edge
ij is updated from the two other edges of the triangles ijk, "outgoing" (ik, jk) or "incoming"
(ki, kj)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from fold_ops import reference
from fold_ops.tracing import fx_tracing
from fold_ops.weight_casts import cast_stacked, cast_weight, concatenated
from torch import nn

from fold_model import ops
from fold_model.layers.primitives import LayerNorm, Linear, chunked_rows
from fold_model.seams import IDENTITY_COMM, AxialComm

__all__ = [
    "TriangleMultiplication",
    "TriangleMultiplicationOutgoing",
    "TriangleMultiplicationIncoming",
    "triangle_product",
]


def _product(a: torch.Tensor, b: torch.Tensor, outgoing: bool) -> torch.Tensor:
    return a @ b.mT if outgoing else a.mT @ b  # [*, c, I, J]


class _TriangleProduct(torch.autograd.Function):
    """``x = a @ b^T`` (outgoing, ``sum_k a_ik b_jk``) or ``a^T @ b`` (incoming, ``sum_k a_ki
    b_kj``) over ``[*, c]``, whose backward returns d(a) and d(b) in a's and b's own layout.
    Autograd's backward of ``a @ b.mT`` returns d(b) as the transpose of a product (I-fast, and
    likewise d(a) of ``a.mT @ b``); the projections' backward reads both as ``[c, I J]`` rows.
    Here each gradient is one product written in its operand's layout (cuBLAS takes the
    transposed operands as they are)."""

    @staticmethod
    def forward(ctx, a, b, outgoing):
        ctx.save_for_backward(a, b)
        ctx.outgoing = outgoing
        return _product(a, b, outgoing)

    @staticmethod
    def backward(ctx, dx):
        a, b = ctx.saved_tensors
        da = db = None
        if ctx.outgoing:  # a [*, c, I, K], b [*, c, J, K]
            if ctx.needs_input_grad[0]:
                da = dx @ b  # [*, c, I, K]
            if ctx.needs_input_grad[1]:
                db = dx.mT @ a  # [*, c, J, K]
        else:  # a [*, c, K, I], b [*, c, K, J]
            if ctx.needs_input_grad[0]:
                da = b @ dx.mT  # [*, c, K, I]
            if ctx.needs_input_grad[1]:
                db = a @ dx  # [*, c, K, J]
        return da, db, None


def _records(*tensors: torch.Tensor) -> bool:
    """Autograd records an op of ``tensors`` (one of them takes a gradient) and torch.fx is not
    tracing it (AutoChunk follows the composed ops' dims). fx_tracing first: requires_grad of
    a traced proxy would be control flow on a proxy."""
    return (not fx_tracing() and torch.is_grad_enabled()
            and any(t.requires_grad for t in tensors))


def triangle_product(a: torch.Tensor, b: torch.Tensor, outgoing: bool) -> torch.Tensor:
    """``a @ b.mT`` (outgoing) or ``a.mT @ b`` (incoming), ``[*, c, I, J]``; with autograd the
    gradients of a and b come back in their own layouts (:class:`_TriangleProduct`). fx
    tracing and inference take the plain product."""
    if _records(a, b):
        return _TriangleProduct.apply(a, b, outgoing)
    return _product(a, b, outgoing)


class TriangleMultiplication(nn.Module):
    """Alg. 11 (outgoing, ``z_ij = sum_k a_ik b_jk``) and Alg. 12 (incoming, ``sum_k a_ki b_kj``).

    Outgoing takes the row-layout pair ``[*, N_i/P, N_j, C_z]``, incoming the column layout
    ``[*, N_i, N_j/P, C_z]``; ``pair_mask`` is in the same layout as z. The projections a and b
    are computed channel-first, ``[*, c, rows, cols]`` (``W z^T``: the GEMM writes the transposed
    layout), so the sum over k is one batched matrix product per channel with no layout copies
    (``einsum`` over channel-last operands copies a, b and the product to channel-first and back,
    about 0.15 TB/s on an H100), in either direction and without transposing z. Under DAP the
    operand whose rows or columns are split is all-gathered
    (:meth:`AxialComm.all_gather_for_triangle`). With ``chunk_size`` output rows are computed
    in slices.
    """

    def __init__(self, c_z: int, c_hidden: int, outgoing: bool) -> None:
        super().__init__()
        self.outgoing = outgoing
        self.layer_norm_in = LayerNorm(c_z)
        self.linear_a_p = Linear(c_z, c_hidden)
        self.linear_a_g = Linear(c_z, c_hidden, init="gating")
        self.linear_b_p = Linear(c_z, c_hidden)
        self.linear_b_g = Linear(c_z, c_hidden, init="gating")
        self.linear_g = Linear(c_z, c_z, init="gating")
        self.layer_norm_out = LayerNorm(c_hidden)
        self.linear_z = Linear(c_hidden, c_z, init="final")

    @staticmethod
    def _gated_projections(
        z_ln: torch.Tensor, pair_mask: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``a = (z W_ap + b_ap) * sigmoid(z W_ag + b_ag) * mask`` and likewise b, channel-first
        ``[*, c, rows, cols]`` from ``z_ln [*, rows, cols, C_z]``: the four projections as one
        op (``ops.triangle_projection``). Its torch reference is one channel-first GEMM (an
        einsum: rows stay a dim of their own, which AutoChunk follows; under autocast it runs in
        the autocast dtype) and the fused gate; the fold-kernels backend puts the gate in the
        GEMM's epilogue (the four projections, twice the pair, are never written) and returns
        d(z_ln) channel-last, so adding it to linear_g's d(z_ln) is no strided add. ``weight
        [4c, C_z]``, ``bias [4c]``: :meth:`_stacked_projections`."""
        return ops.triangle_projection(z_ln, weight, bias, pair_mask)

    def _stacked_projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The weights ``[4c, C_z]`` and biases ``[4c]`` of the four projections, stacked
        (cast once per block forward where a group serves them)."""
        layers = (self.linear_a_p, self.linear_a_g, self.linear_b_p, self.linear_b_g)
        weight = cast_stacked([lin.weight for lin in layers], "cat", concatenated)
        bias = cast_stacked([lin.bias for lin in layers], "cat", concatenated)
        return weight, bias

    def forward(
        self,
        z: torch.Tensor,
        pair_mask: torch.Tensor,
        comm: AxialComm = IDENTITY_COMM,
        chunk_size: int | None = None,
    ) -> torch.Tensor:
        return self.forward_residual(z, pair_mask, comm, chunk_size)[0]

    def _one_op_args(self, z: torch.Tensor, pair_mask: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor) -> tuple:
        """``ops.triangle_multiplication``'s arguments: the weights as the composed layer
        reads them (cast once per block forward where a group serves them)."""
        return (z, pair_mask, self.layer_norm_in.weight, self.layer_norm_in.bias, weight, bias,
                cast_weight(self.linear_g.weight), self.linear_g.bias,
                self.layer_norm_out.weight, self.layer_norm_out.bias,
                cast_weight(self.linear_z.weight), self.linear_z.bias, self.outgoing,
                self.layer_norm_in.eps)

    def forward_residual(
        self,
        z: torch.Tensor,
        pair_mask: torch.Tensor,
        comm: AxialComm = IDENTITY_COMM,
        chunk_size: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(update, z)``: the update and z passed on for the residual sum. The normalised z
        is read by the projections and by the output gate (``LayerNorm.fork``): in backward the
        gradients of both and of the residual's z meet in LayerNorm's one pass.

        In training (autograd, unchunked, undistributed) the update is ``ops.
        triangle_multiplication`` where a backend other than the reference serves it: the
        same ops as one autograd node (fold-kernels), the host time of one node instead of a
        dozen. Otherwise the layer composes the ops itself."""
        weight, bias = self._stacked_projections()  # [4c, C_z], [4c]
        if chunk_size is None and comm is IDENTITY_COMM and _records(z, self.layer_norm_in.weight):
            args = self._one_op_args(z, pair_mask, weight, bias)
            try:
                one_op = ops.resolve("triangle_multiplication", *args)
            except ops.BackendUnavailable:  # a backend asked for every op serves the steps
                one_op = reference.triangle_multiplication
            if one_op is not reference.triangle_multiplication:
                return one_op(*args)
        z, z_ln, z_ln_gate = self.layer_norm_in.fork(z, 2)
        # [*, c, rows, cols] each; with chunk_size in row slices, so the four projections
        # [*, 4c, rows, cols] (twice the pair at c = C_z) exist for one slice at a time
        a, b = chunked_rows(self._gated_projections, chunk_size, ((z_ln, -3), (pair_mask, -2)),
                            (weight, bias), out_dim=-2)
        if self.outgoing:  # rows of i are local; x_ij = sum_k a_ik b_jk needs every row j of b
            b = comm.all_gather_for_triangle(b, -2)  # [*, c, N_j, N_k]
            left = (a, -2)  # output rows i are rows of a
        else:  # columns of j are local; x_ij = sum_k a_ki b_kj needs every column i of a
            a = comm.all_gather_for_triangle(a, -1)  # [*, c, N_k, N_i]
            left = (a, -1)  # output rows i are columns of a

        def product(a_i: torch.Tensor, z_ln_i: torch.Tensor) -> torch.Tensor:
            x = triangle_product(a_i, b, self.outgoing)  # [*, c, I, J]
            # LayerNorm reads the channel-first product through its strides: no copy
            x = F.linear(self.layer_norm_out(x.movedim(-3, -1)), cast_weight(self.linear_z.weight))
            g = F.linear(z_ln_i, cast_weight(self.linear_g.weight))  # [*, I, J, C_z] each
            # linear_z's and linear_g's biases are added in the gate op, whose backward sums
            # their gradients in its own pass (no column sum of a pair-sized gradient each)
            return ops.bias_sigmoid_gate(x, g, self.linear_g.bias, self.linear_z.bias)

        return chunked_rows(product, chunk_size, (left, (z_ln_gate, -3)), out_dim=-3), z


class TriangleMultiplicationOutgoing(TriangleMultiplication):
    """Alg. 11."""

    def __init__(self, c_z: int, c_hidden: int) -> None:
        super().__init__(c_z, c_hidden, outgoing=True)


class TriangleMultiplicationIncoming(TriangleMultiplication):
    """Alg. 12."""

    def __init__(self, c_z: int, c_hidden: int) -> None:
        super().__init__(c_z, c_hidden, outgoing=False)
