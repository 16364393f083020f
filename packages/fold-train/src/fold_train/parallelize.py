"""One function applies the run's techniques to a built model, in a fixed order (as torchtitan's
``parallelize_*``): the Trainer and ``fold-train predict`` both call :func:`parallelize`.

The order, and why:

1. **weight dtype**: ``bf16_weights`` casts the family's trunk to bf16 (``Family.to_bf16_weights``)
   before anything records parameters (the optimizer's flat buffers come after, one group per
   dtype, with fp32 masters);
2. **model parallelism**: DAP over the family's ``dap_stacks`` through
   ``fold_parallel.enable_dap``, BP over its ``bp_stacks`` through ``fold_parallel.enable_bp``
   (hooks and comms only: parameters and state-dict keys unchanged, so this may follow 1);
3. **activation checkpointing**: a fixed choice (true/false, ``model.uncheckpointed_*``) is part
   of the model config the model was built from; ``auto`` is planned on the first training batch
   (:mod:`fold_train.ckpt_plan`), so this step only reports that a plan is pending;
4. **chunking** (prediction): the manual chunk size, or AutoChunk wrappers around the family's
   ``autochunk_names`` stacks (after the weights are loaded: the wrapped keys gain a level),
   AF3's diffusion samples in groups, AF2's MSA offload to host memory (before AutoChunk traces
   the stacks);
5. **compile**: ``torch.compile`` of the family's memory-bound module, after the stacks have
   their DAP hooks (compiling first would trace the single-device calls);
6. **CUDA graphs**: last, since a graph captures whatever the steps above made of the model:
   the training step's capture backend (one pool for all buckets), or, for prediction, whether
   the predictor replays graphs (never with AutoChunk, which plans from the first pass's free
   memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Parallelized", "Techniques", "parallelize"]


@dataclass(frozen=True)
class Techniques:
    """What :func:`parallelize` applies (each off by default)."""

    bf16_weights: bool = False
    groups: Any = None  # fold_parallel.ParallelGroups (DAP / BP degrees and process groups)
    dao: bool = True  # DAP's all-to-alls overlapped with compute (FastFold's DAO); false: sync
    plan_checkpointing: bool = False  # activation_checkpointing=auto (planned on a batch)
    chunk_size: int | None = None
    autochunk: Any = None  # AutoChunk memory budget (bytes or "auto")
    autochunk_min_chunk: int = 1
    sample_group_size: int | None = None  # AF3: diffusion samples in groups (prediction)
    msa_offload: bool = False  # AF2: MSA representations in host memory (prediction)
    compile: bool = False
    cuda_graphs: bool = False
    device: torch.device | None = None  # where training graphs are captured
    generators: tuple = ()  # generators a training graph replays (AF3's diffusion noise)


@dataclass
class Parallelized:
    """What :func:`parallelize` installed."""

    parallel_handles: list = field(default_factory=list)  # fold-parallel DAP / BP handles
    checkpoint_plan_pending: bool = False
    autochunked: dict[str, Any] = field(default_factory=dict)  # stack name -> AutoChunkedStack
    graph_backend: Any = None  # training: a fold_train.cuda_graphs.CaptureBackend
    cuda_graphs: bool = False  # prediction: replay captured graphs


def parallelize(model: torch.nn.Module, family, techniques: Techniques, *,
                graph_backend: Any = None) -> Parallelized:
    """Apply ``techniques`` to ``model`` of ``family`` in the order of the module docstring.
    ``graph_backend`` replaces the CUDA capture of training steps (tests)."""
    t = techniques
    out = Parallelized()
    if t.bf16_weights:
        family.to_bf16_weights(model)
    if t.groups is not None:
        out.parallel_handles = _model_parallel(model, family, t.groups, t.dao)
    out.checkpoint_plan_pending = t.plan_checkpointing
    if t.chunk_size:
        family.set_chunking(model, t.chunk_size)
    if t.msa_offload:  # before AutoChunk traces the stacks
        family.set_msa_offload(model, True)
    if t.autochunk is not None:
        out.autochunked = family.enable_autochunk(model, t.autochunk, t.autochunk_min_chunk)
    if t.sample_group_size is not None:
        family.set_sample_groups(model, t.sample_group_size)
    if t.compile:
        family.compile(model)
    out.cuda_graphs = bool(t.cuda_graphs) and t.autochunk is None
    if t.cuda_graphs and t.device is not None:
        from fold_train.cuda_graphs import CudaGraphBackend

        out.graph_backend = graph_backend or CudaGraphBackend(t.device,
                                                              generators=list(t.generators))
    return out


def _model_parallel(model, family, groups, dao: bool = True) -> list:
    """DAP and BP of the family's stacks per ``groups`` (fold-parallel's process groups);
    ``dao``: DAP's communication overlapped with compute in forward and backward."""
    from fold_parallel import Collectives, DapComm, enable_bp, enable_dap

    cfg = groups.config
    handles = []
    if cfg.bp == 2:
        coll = Collectives(groups.bp_group, name="BP group")
        handles += [enable_bp(s, coll) for s in family.bp_stacks(model)]
    if cfg.dap > 1:
        comm = DapComm(groups.dap_group, overlap_forward=dao, overlap_backward=dao)
        handles += [enable_dap(s, comm) for s in family.dap_stacks(model)]
    return handles

