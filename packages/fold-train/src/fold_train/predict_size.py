"""``fold-train predict`` sizes its input before any feature is made: the data limits of
:mod:`fold_data.limits` (tokens, atoms, MSA memory), then the device memory of
:mod:`fold_train.memory_estimate`. An input that cannot fit is refused in a second, with the
numbers and the options, instead of running until killed."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch
from fold_data.errors import InputError
from fold_data.limits import InputSize, SizeLimits, check_size, entry_size, sequence_size

from fold_train.memory_estimate import (
    MemoryEstimate,
    af2_estimate,
    af3_estimate,
    budget_bytes,
    check_memory,
    fused_attention,
)
from fold_train.predict_dap import more_ranks_hint, rank_plan

__all__ = ["af2_input_estimate", "af3_input_estimate", "check_af2_input", "check_af3_input"]

_MORE_MEMORY = ("a device with more free memory (or, if more is free than measured, "
                "--memory-limit BYTES)")


def _af2_size(fasta, mmcif, chain, msas: Sequence) -> tuple[str, InputSize]:
    """``(source, size)`` of an AF2 query: the first FASTA record, or the mmCIF's chain (parsed:
    the file is sized first by ``parse_mmcif``)."""
    if fasta is not None:
        from fold_train.predict import read_query

        name, sequence = read_query(fasta)
        return os.fspath(fasta), sequence_size(fasta, sequence, msas, name=name)
    from fold_data.mmcif import parse_mmcif

    if chain is None:
        raise InputError(mmcif, None, "expected a chain ID (--chain) for an mmCIF input")
    found = parse_mmcif(mmcif).get_chain(chain)
    return os.fspath(mmcif), sequence_size(mmcif, found.sequence, msas, name=f"chain {chain}")


def af2_input_estimate(*, fasta=None, mmcif=None, chain=None, msas: Sequence = (),
                       model_config, data_preset, precision: str,
                       chunk_size: int | None = None, msa_offload: bool = False,
                       limits: SizeLimits | None = None, fused: bool = False
                       ) -> tuple[str, InputSize, MemoryEstimate]:
    """``(source, size, one-device estimate)`` of an AF2 query: read, held to the data
    ``limits``, not featurised (what :func:`check_af2_input` checks, and what
    ``fold_train.predict_dap.plan_batch`` shares out); ``fused``: the attention kernels store
    no logits (:func:`fold_train.memory_estimate.fused_attention`)."""
    source, size = _af2_size(fasta, mmcif, chain, msas)
    check_size(size, limits, record="query")
    return source, size, af2_estimate(size.n_tokens, model_config, data_preset,
                                       precision=precision, chunk_size=chunk_size,
                                       msa_offload=msa_offload, fused_attention=fused)


def af3_input_estimate(entry, ccd, *, model_config, precision: str,
                       no_samples: int | None = None, limits: SizeLimits | None = None,
                       chunk_size: int | None = None, sample_group: int | None = None,
                       fused: bool = False) -> tuple[InputSize, MemoryEstimate]:
    """``(size, one-device estimate)`` of an AF3 entry (parsed, not featurised), held to the
    data ``limits``; ``fused`` as for :func:`af2_input_estimate`."""
    size = entry_size(entry, ccd)
    check_size(size, limits, record=entry.name)
    return size, af3_estimate(size, model_config, precision=precision, no_samples=no_samples,
                              chunk_size=chunk_size, sample_group=sample_group,
                              fused_attention=fused)


def check_af2_input(*, fasta=None, mmcif=None, chain=None, msas: Sequence = (), model_config,
                    data_preset, precision: str, device: torch.device | str,
                    chunk_size: int | None = None, memory_limit: int | None = None,
                    msa_offload: bool = False,
                    memory: Callable[[torch.device], int] | None = None,
                    limits: SizeLimits | None = None, dap: int = 1) -> InputSize:
    """Refuse an AF2 query over the data ``limits`` or the device's memory (``memory_limit``
    bytes, else ``memory(device)``: the free memory); returns its size. ``dap``: the memory of
    one rank of that DAP degree (:func:`fold_train.predict_dap.rank_estimate`)."""
    source, size, whole = af2_input_estimate(
        fasta=fasta, mmcif=mmcif, chain=chain, msas=msas, model_config=model_config,
        data_preset=data_preset, precision=precision, chunk_size=chunk_size,
        msa_offload=msa_offload, limits=limits, fused=fused_attention(device, precision))
    budget = budget_bytes(device, memory_limit, memory)
    mine, chunking = rank_plan(whole, dap)  # this rank's part under DAP
    check_memory(mine, budget, source=source, device=str(device),
                 options=[*chunking, _MORE_MEMORY, more_ranks_hint(whole, budget, dap),
                          "crop the query (predict a domain: fewer residues)"])
    return size


def check_af3_input(entry, ccd, *, model_config, precision: str, device: torch.device | str,
                    no_samples: int | None = None, memory_limit: int | None = None,
                    memory: Callable[[torch.device], int] | None = None,
                    limits: SizeLimits | None = None, chunk_size: int | None = None,
                    sample_group: int | None = None, dap: int = 1) -> InputSize:
    """Refuse an AF3 entry (parsed, not featurised) over the data ``limits`` or the device's
    memory (per rank under DAP ``dap``); returns its size."""
    size, whole = af3_input_estimate(entry, ccd, model_config=model_config, precision=precision,
                                     no_samples=no_samples, limits=limits,
                                     chunk_size=chunk_size, sample_group=sample_group,
                                     fused=fused_attention(device, precision))
    budget = budget_bytes(device, memory_limit, memory)
    check_memory(rank_plan(whole, dap)[0], budget, source=size.source, device=str(device),
                 options=["samples in smaller groups (--sample-group 1) or fewer diffusion "
                          "samples (--samples 1)", _MORE_MEMORY,
                          more_ranks_hint(whole, budget, dap),
                          f"crop the input (fewer chains or residues: {size.describe()})"])
    return size
