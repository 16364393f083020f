"""Dynamic Axial Parallelism (FastFold section 4.2): the distributed axial seam.

:class:`DapComm` implements :class:`fold_model.seams.AxialComm` over a DAP process group: the MSA
``[*, N_seq, N_res, C_m]`` and pair ``[*, N_res, N_res, C_z]`` are split along the axis the next
module does *not* compute along; ``row_to_col`` / ``col_to_row`` are all-to-alls, the pair biases
and the right operands of the outer product mean and of the triangle multiplications are
all-gathered, the row-layout outer product mean is reduce-scattered. The ``*_async`` / ``wait``
pairs are Duality Async Operations (:mod:`fold_parallel.dao`).

:func:`enable_dap` puts a stack (``EvoformerStack``, ``ExtraMsaStack``, ``TemplatePairStack``)
under DAP without changing its parameters or its call signature: it sets the comm and wraps the
call so that N_res (and N_seq) are zero-padded, with zero masks, to a multiple of the DAP size on
the way in and cropped on the way out. Padded residues are masked keys everywhere (attention,
outer product mean, triangle multiplication), so the real outputs are unchanged.

AlphaFold3's trunk stacks (``MSAModule``, ``PairformerStack``, ``TemplateEmbedder``) scatter
their full-size inputs and gather their output themselves: :func:`enable_dap` only sets their
comm (no hooks), and their N_token and MSA rows must already be multiples of the DAP size
(fixed-size crops; fold-train checks the data preset).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from fold_model.af2.evoformer import EvoformerStack, ExtraMsaStack
from fold_model.af2.template import TemplatePairStack
from fold_model.af3.msa_module import MSAModule
from fold_model.af3.pairformer import PairformerStack
from fold_model.af3.template import TemplateEmbedder
from fold_model.seams import IDENTITY_COMM, AxialComm
from torch import nn

from fold_parallel import comm as C
from fold_parallel import dao
from fold_parallel.guard import ConsistencyError, guarded

__all__ = ["DapComm", "pad_to_multiple", "enable_dap", "DapHandle"]


class DapComm(AxialComm):
    """The axial seam over ``group`` (``None``: all ranks).

    ``impl``: collectives backend (:class:`fold_parallel.comm.Collectives`); ``comm_dtype``:
    send floating tensors in this dtype (e.g. ``torch.bfloat16``); ``overlap_forward`` /
    ``overlap_backward``: the two DAO overlaps (both off = synchronous DAP).
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        impl: C.Impl = "auto",
        comm_dtype: torch.dtype | None = None,
        overlap_forward: bool = True,
        overlap_backward: bool = True,
        timeout_s: float | None = None,
    ) -> None:
        self.coll = C.Collectives(group, impl, comm_dtype, timeout_s, name="DAP group")
        self.overlap_forward = overlap_forward
        self.overlap_backward = overlap_backward

    @property
    def size(self) -> int:
        return self.coll.size

    @property
    def rank(self) -> int:
        return self.coll.rank

    @property
    def dao(self) -> bool:
        """Whether any DAO overlap is on."""
        return self.overlap_forward or self.overlap_backward

    def scatter(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        return C.scatter(x, dim, self.coll)

    def gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        return C.all_gather(x, dim, self.coll)

    def reduce_scatter(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        return C.reduce_scatter(x, dim, self.coll)

    def row_to_col(self, x: torch.Tensor) -> torch.Tensor:
        return C.all_to_all(x, -2, -3, self.coll)  # [*, A/P, B, C] -> [*, A, B/P, C]

    def col_to_row(self, x: torch.Tensor) -> torch.Tensor:
        return C.all_to_all(x, -3, -2, self.coll)  # [*, A, B/P, C] -> [*, A/P, B, C]

    def all_gather_for_outer_product(self, x: torch.Tensor) -> torch.Tensor:
        return self.gather(x, -2)  # [*, N_seq, N_res/P, c] -> [*, N_seq, N_res, c]

    def all_gather_for_triangle(self, x: torch.Tensor, dim: int = -3) -> torch.Tensor:
        return self.gather(x, dim)  # e.g. [*, c, N_i/P, N_k] -> [*, c, N_i, N_k] (dim -2)

    def _start(self, x: torch.Tensor, split_dim: int, cat_dim: int) -> Any:
        # Also without overlap: a DAO pair that launches in `wait` is skipped by a checkpoint's
        # recomputation, which stops before the wait (see fold_parallel.dao).
        return dao.start_all_to_all(
            x, split_dim, cat_dim, self.coll, self.overlap_forward, self.overlap_backward
        )

    def row_to_col_async(self, x: torch.Tensor) -> Any:
        return self._start(x, -2, -3)

    def col_to_row_async(self, x: torch.Tensor) -> Any:
        return self._start(x, -3, -2)

    def wait(self, handle: Any) -> torch.Tensor:
        return dao.wait(handle) if isinstance(handle, dao.AsyncHandle) else handle


def pad_to_multiple(
    x: torch.Tensor, dims: Sequence[int], multiple: int, value: float = 0.0
) -> torch.Tensor:
    """Zero-pad (``value``) the end of each of ``dims`` up to a multiple of ``multiple``."""
    pad = [0] * (2 * x.dim())
    for d in dims:
        d = d % x.dim()
        extra = -x.shape[d] % multiple
        pad[2 * (x.dim() - 1 - d) + 1] = extra  # F.pad lists dims from the last
    if not any(pad):
        return x
    return F.pad(x, pad, value=value)


# Per stack: which dims of each positional argument are N_seq / N_res (padded), and how to crop
# each output back: output index -> {dim: name of the original size}.
_SEQ, _RES = "seq", "res"
_PAD_SPECS: dict[type, tuple[tuple[dict[int, str], ...], Any]] = {
    # forward(m, z, msa_mask, pair_mask) -> (m, z, s)
    EvoformerStack: (
        ({-3: _SEQ, -2: _RES}, {-3: _RES, -2: _RES}, {-2: _SEQ, -1: _RES}, {-2: _RES, -1: _RES}),
        ({-3: _SEQ, -2: _RES}, {-3: _RES, -2: _RES}, {-2: _RES}),
    ),
    # forward(a, z, extra_msa_mask, pair_mask) -> z
    ExtraMsaStack: (
        ({-3: _SEQ, -2: _RES}, {-3: _RES, -2: _RES}, {-2: _SEQ, -1: _RES}, {-2: _RES, -1: _RES}),
        {-3: _RES, -2: _RES},
    ),
    # forward(t, pair_mask) -> t
    TemplatePairStack: (({-3: _RES, -2: _RES}, {-2: _RES, -1: _RES}), {-3: _RES, -2: _RES}),
}


# Stacks that scatter their inputs and gather their outputs themselves (AlphaFold3's trunk).
_SELF_SPLITTING = (MSAModule, PairformerStack, TemplateEmbedder)


def _crop(x: torch.Tensor, dims: dict[int, str], sizes: dict[str, int]) -> torch.Tensor:
    for d, name in dims.items():
        x = x.narrow(d, 0, sizes[name])
    return x


class DapHandle:
    """What :func:`enable_dap` installed; :meth:`remove` restores single-device behaviour."""

    def __init__(self, stack: nn.Module, hooks: list, previous_comm: AxialComm) -> None:
        self._stack, self._hooks, self._previous = stack, hooks, previous_comm

    @property
    def stack(self) -> nn.Module:
        """The stack under DAP."""
        return self._stack

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._stack.set_comm(self._previous)


def enable_dap(stack: nn.Module, comm: DapComm, check_shapes: bool = True) -> DapHandle:
    """Run ``stack`` under DAP: ``stack.set_comm(comm)`` plus forward hooks that pad N_seq and
    N_res to a multiple of ``comm.size`` (masks padded with 0) and crop the outputs back.

    With ``check_shapes`` each call first compares the input shapes across the DAP group (one
    tiny all-gather) and raises :class:`~fold_parallel.guard.ConsistencyError` on every rank when
    they differ. Parameters and ``state_dict`` keys are untouched.

    AlphaFold3's ``MSAModule``, ``PairformerStack`` and ``TemplateEmbedder`` split themselves:
    only their comm is set (no padding, no shape check; sizes must divide by ``comm.size``).
    """
    previous = getattr(stack, "comm", IDENTITY_COMM)
    if isinstance(stack, _SELF_SPLITTING):
        stack.set_comm(comm)
        return DapHandle(stack, [], previous)
    spec = next((s for cls, s in _PAD_SPECS.items() if isinstance(stack, cls)), None)
    if spec is None:
        raise TypeError(
            f"enable_dap supports EvoformerStack, ExtraMsaStack, TemplatePairStack and AF3's "
            f"MSAModule, PairformerStack, TemplateEmbedder; got {type(stack).__name__}"
        )
    in_dims, out_dims = spec
    sizes: dict[str, int] = {}

    def pre_hook(module: nn.Module, args: tuple) -> tuple:
        if len(args) != len(in_dims):
            raise TypeError(
                f"DAP {type(module).__name__}: pass the {len(in_dims)} inputs positionally"
            )
        if check_shapes:
            _check_input_shapes(args, comm)
        sizes.clear()
        for x, dims in zip(args, in_dims):
            for d, name in dims.items():
                sizes.setdefault(name, x.shape[d])
        return tuple(
            pad_to_multiple(x, list(dims), comm.size) for x, dims in zip(args, in_dims)
        )

    def hook(module: nn.Module, args: tuple, out: Any) -> Any:
        if isinstance(out, tuple):
            return tuple(_crop(o, dims, sizes) for o, dims in zip(out, out_dims))
        return _crop(out, out_dims, sizes)

    stack.set_comm(comm)
    hooks = [stack.register_forward_pre_hook(pre_hook), stack.register_forward_hook(hook)]
    return DapHandle(stack, hooks, previous)


_DESC_LEN = 64


def _check_input_shapes(args: tuple, comm: DapComm) -> None:
    """All ranks of the DAP group must call with equal shapes (else the all-to-alls would hang or
    exchange garbage): compare them with one small all-gather of integers.

    Cost on NCCL: one pinned, non-blocking upload, one all-gather and one download, i.e. one host
    synchronisation per stack call (the download must wait for the GPU queue to drain), where the
    first version had three (a pageable upload and one ``torch.equal`` per rank). Turn it off
    (``check_shapes=False``) where the inputs are known to agree, e.g. in benchmarks.
    """
    desc = [len(args)]
    for x in args:
        desc += [x.dim(), *x.shape]
    # Fixed length, so that ranks with different ranks of tensors still exchange equal sizes.
    desc = (desc + [-1] * _DESC_LEN)[:_DESC_LEN]
    mine = torch.tensor(desc, dtype=torch.int64)
    if "nccl" in str(dist.get_backend(comm.coll.group)):  # NCCL moves device tensors only
        mine = mine.pin_memory().to(torch.cuda.current_device(), non_blocking=True)
    everyone = mine.new_empty(comm.size * _DESC_LEN)  # [P * _DESC_LEN]
    with guarded("DAP input shape check (a rank may be missing or have more inputs)"):
        dist.all_gather_into_tensor(everyone, mine, group=comm.coll.group)
    rows = everyone.view(comm.size, _DESC_LEN).tolist()  # the one host synchronisation
    if any(row != desc for row in rows):
        shapes = [_decode(row) for row in rows]
        listing = "; ".join(f"rank {r}: {s}" for r, s in enumerate(shapes))
        raise ConsistencyError(
            f"DAP rank {comm.rank}: the ranks of the DAP group were called with different input "
            f"shapes ({listing}); every DAP rank must see the same sample"
        )


def _decode(desc: list[int]) -> list[tuple[int, ...]]:
    out, i = [], 1
    for _ in range(desc[0]):
        nd = desc[i]
        out.append(tuple(desc[i + 1 : i + 1 + nd]))
        i += 1 + nd
    return out
