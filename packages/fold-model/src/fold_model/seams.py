"""The axial seam (Dynamic Axial Parallelism, FastFold section 4.2) and the branch seam.

Evoformer, extra-MSA and template pair blocks are written to work on a *shard*:

* the MSA ``[*, N_seq, N_res, C]`` and the pair ``[*, N_res_i, N_res_j, C]`` arrive in **row
  layout**, split over their dim -3 (N_seq for the MSA, i for the pair);
* a block moves a tensor to **column layout** (split over dim -2: N_res for the MSA, j for the
  pair) with :meth:`AxialComm.row_to_col` and back with :meth:`AxialComm.col_to_row` (all-to-all
  under DAP);
* where an operation needs the whole of a split axis it gathers a small derived tensor: the pair
  bias of MSA row attention and of triangle attention (heads-first ``[*, H, N_i/P, N_j]``,
  ``gather(bias, -2)``), the right-hand projection of the outer product mean
  (:meth:`all_gather_for_outer_product`) and of triangle multiplication
  (:meth:`all_gather_for_triangle`);
* masks enter blocks whole and are sliced to the local shard with :meth:`scatter` (no
  communication).

On one device every method is the identity, which is this class. fold-parallel subclasses it with
torch.distributed collectives (autograd functions whose backward is the dual collective: the
backward of ``gather`` is ``reduce_scatter``, of ``row_to_col`` is ``col_to_row``) and overrides
only these methods. The ``*_async`` / :meth:`wait` pairs let DAP start an all-to-all and overlap
it with independent work (FastFold's Duality Async Operations).

Dropout masks that broadcast over a split axis (``DropoutRowwise`` on the MSA) must be equal on
every rank, so a DAP implementation keeps the ranks' RNG states in step.

The branch seam is :class:`BranchSeam`: the Parallel Evoformer block
(:class:`fold_model.af2.evoformer.ParallelEvoformerBlock`) implements it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["AxialComm", "BranchSeam", "IDENTITY_COMM"]


class AxialComm:
    """Axial layout changes for DAP; the identity on one device (``size == 1``)."""

    @property
    def size(self) -> int:
        """Number of ranks the axial dims are split over."""
        return 1

    @property
    def rank(self) -> int:
        """This rank's index in the axial group."""
        return 0

    def scatter(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """The local slice of a whole tensor along ``dim`` (e.g. masks into the current layout)."""
        return x

    def gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """All-gather the local shards along ``dim`` into the whole tensor."""
        return x

    def reduce_scatter(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Sum partial whole tensors over ranks and keep the local slice along ``dim``."""
        return x

    def row_to_col(self, x: torch.Tensor) -> torch.Tensor:
        """``[*, A/P, B, C] -> [*, A, B/P, C]``: MSA split over N_seq -> over N_res; pair split
        over i -> over j (all-to-all)."""
        return x

    def col_to_row(self, x: torch.Tensor) -> torch.Tensor:
        """``[*, A, B/P, C] -> [*, A/P, B, C]``: the inverse of :meth:`row_to_col`."""
        return x

    def all_gather_for_outer_product(self, x: torch.Tensor) -> torch.Tensor:
        """Column-layout MSA projection ``[*, N_seq, N_res/P, c]`` -> ``[*, N_seq, N_res, c]``
        (the right operand of the outer product mean)."""
        return self.gather(x, -2)

    def all_gather_for_triangle(self, x: torch.Tensor, dim: int = -3) -> torch.Tensor:
        """The split operand of triangle multiplication, whole along ``dim``: its channel-first
        projection ``[*, c, N_i/P, N_k]`` along -2 (outgoing) or ``[*, c, N_k, N_j/P]`` along -1
        (incoming); the default -3 gathers a channel-last ``[*, N_i/P, N_k, c]``."""
        return self.gather(x, dim)

    def row_to_col_async(self, x: torch.Tensor) -> Any:
        """Start :meth:`row_to_col`; returns a handle for :meth:`wait`."""
        return self.row_to_col(x)

    def col_to_row_async(self, x: torch.Tensor) -> Any:
        """Start :meth:`col_to_row`; returns a handle for :meth:`wait`."""
        return self.col_to_row(x)

    def wait(self, handle: Any) -> torch.Tensor:
        """Finish an async layout change and return its tensor."""
        return handle


IDENTITY_COMM = AxialComm()


@runtime_checkable
class BranchSeam(Protocol):
    """What Branch Parallelism needs from a block with independent MSA and pair branches.

    ``msa_branch(m, z, msa_mask) -> m'`` reads the pair only for the row-attention bias;
    ``pair_branch(z, pair_mask) -> z'`` reads nothing of the MSA;
    ``outer_product_update(m', msa_mask) -> dz`` is the cross-communication (computed on the MSA
    rank under BP and sent to the pair rank);
    ``join(m', z', msa_mask, dz=None) -> (m', z' + dz)``.
    """

    def msa_branch(
        self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor
    ) -> torch.Tensor: ...

    def pair_branch(self, z: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor: ...

    def outer_product_update(self, m: torch.Tensor, msa_mask: torch.Tensor) -> torch.Tensor: ...

    def join(
        self,
        m: torch.Tensor,
        z: torch.Tensor,
        msa_mask: torch.Tensor,
        dz: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...
