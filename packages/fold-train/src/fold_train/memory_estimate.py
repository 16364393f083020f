"""Device memory of a prediction, estimated from the input's size and the model config before
any feature is made or the model runs.

fold-data sizes an input (:mod:`fold_data.limits`: tokens, atoms, MSA rows); this module turns
the size into bytes for the model and compares them with the memory the device has free (the
memory source is injectable: ``memory_limit=`` / ``--memory-limit`` sets the budget, ``memory=``
replaces how it is measured). The estimate is two parts:

* **resident**: what lives through the trunk: the pair representation ``[N, N, c_z]`` and its
  update, the MSA representation ``[N_seq, N, c_m]`` (AF2 also the extra MSA ``[N_extra, N,
  c_e]``; AF3 also the diffusion's pair conditioning). Chunking cannot shrink it: above the
  budget, only a larger device or a smaller input helps.
* **transient**: the largest intermediate of one block, unchunked: triangle attention logits
  ``[N, H, N, N]``, MSA row attention logits ``[N_seq, H, N, N]``, the outer product
  ``[N, N, c, c]``, the triangle multiplication projections, AF3's diffusion attention logits
  ``[S, H, N, N]``. Chunking (AF2 ``--chunk-size C`` or ``--autochunk``) splits it along a row
  dimension, leaving ``C / N`` of it. Where the attention ops run in a kernel that keeps the
  logits in registers (fold-kernels' Triton attention on a GPU: :func:`fused_attention` asks
  the op registry), no logits are counted (``fused_attention=True``).

:func:`check_memory` refuses (``fold_data.limits.InputTooLarge``) with the numbers and the
options (chunking, a larger device, crop the input, fewer samples, ``--memory-limit``) when the
peak exceeds the budget, and warns (``SizeWarning``) above 80% of it. The estimate ignores the
weights (already loaded when the budget is measured) and small per-token arrays; it is meant to
tell a 10x-too-large input from one that fits, not to predict the allocator's peak to the byte.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from fold_data.limits import InputSize, InputTooLarge, SizeWarning, format_bytes

__all__ = ["MemoryEstimate", "af2_estimate", "af3_estimate", "budget_bytes", "check_memory",
           "fused_attention"]

WARN_FRACTION = 0.8  # warn above this share of the budget


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of one prediction: ``resident`` and ``transient`` parts by name (module docstring),
    ``chunk_fraction`` of the transient left by chunking (1.0: none), ``shape`` for messages."""

    what: str
    shape: str
    resident: dict[str, int]
    transient: dict[str, int]
    chunk_fraction: float = 1.0
    chunkable: bool = False  # whether the model can chunk this prediction (AF2 predict)

    @property
    def resident_bytes(self) -> int:
        return sum(self.resident.values())

    @property
    def largest_transient(self) -> tuple[str, int]:
        return max(self.transient.items(), key=lambda kv: kv[1])

    @property
    def peak_bytes(self) -> int:
        return self.resident_bytes + int(self.largest_transient[1] * self.chunk_fraction)


def _bytes_per_value(precision: str) -> int:
    return 2 if precision == "bf16" else 4


def fused_attention(device: torch.device | str, precision: str) -> bool:
    """Whether a prediction's attention ops on ``device`` run in a kernel that never stores the
    ``[rows, H, N, N]`` logits (fold-kernels' Triton attention). Asked of fold-model's op
    registry on FakeTensors of a representative self-attention (AF2's MSA rows and triangles,
    ``ops.attention_packed``) and cross-attention call (AF3's diffusion, ``ops.attention``), so
    the answer follows the registered backends, ``FOLD_OPS_BACKEND`` and their ``supports``
    (on the CPU the PyTorch reference serves them and materialises the logits: False). False for
    a CUDA device on a build without CUDA (no FakeTensors of that device)."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        return False
    from fold_model.ops.registry import selected_backend
    from torch._subclasses.fake_tensor import FakeTensorMode

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    h, n, d = 4, 64, 32
    with FakeTensorMode():
        def empty(*shape: int) -> torch.Tensor:
            return torch.empty(shape, device=device, dtype=dtype)

        proj, q = empty(1, 2, n, 4 * h * d), empty(1, 2, h, n, d)  # [B, R, N, 4HD], [B, R, H, N, D]
        bias, mask = empty(1, h, n, n), empty(1, 2, n)
        return (selected_backend("attention_packed", proj, h, bias, mask) != "torch"
                and selected_backend("attention", q, q, q, bias, mask) != "torch")


def _drop_logits(transient: dict[str, int]) -> dict[str, int]:
    """The transients without attention logits (a fused attention kernel keeps them in
    registers; its fp32 row statistics ``[rows, H, 2, N]`` are negligible beside the rest)."""
    return {k: v for k, v in transient.items() if "attention logits" not in k}


def af2_estimate(n_res: int, model_config, data_preset, *, precision: str = "fp32",
                 chunk_size: int | None = None, msa_offload: bool = False,
                 fused_attention: bool = False) -> MemoryEstimate:
    """An AF2 prediction of ``n_res`` residues with the inference sample of ``data_preset``
    (``N_seq = n_clust + n_templ`` rows, ``n_extra`` extra rows; residues padded to at least
    ``n_res`` of the preset); ``chunk_size``: the row chunk (AutoChunk: its smallest chunk);
    ``msa_offload``: the MSA representations wait in host memory (not resident on the device;
    one block's MSA is, while its MSA updates run, counted as a transient);
    ``fused_attention``: no attention logits are stored (:func:`fused_attention`)."""
    n = max(n_res, data_preset.n_res)
    n_seq = data_preset.n_clust + data_preset.n_templ
    evo, extra = model_config.evoformer, model_config.extra_msa
    b = _bytes_per_value(precision)
    resident = {
        f"pair representation [N_res, N_res, c_z={evo.c_z}] and its update":
            2 * n * n * evo.c_z * 4,
        f"MSA representation [N_seq={n_seq}, N_res, c_m={evo.c_m}] and its update":
            2 * n_seq * n * evo.c_m * 4,
    }
    transient = {
        f"triangle attention logits [N_res, H={evo.no_heads_pair}, N_res, N_res]":
            evo.no_heads_pair * n ** 3 * b,
        f"MSA row attention logits [N_seq, H={evo.no_heads_msa}, N_res, N_res]":
            n_seq * evo.no_heads_msa * n * n * b,
        f"outer product mean [N_res, N_res, {evo.c_hidden_opm}, {evo.c_hidden_opm}]":
            n * n * evo.c_hidden_opm ** 2 * b,
        f"triangle multiplication [4, N_res, N_res, {evo.c_hidden_mul}]":
            4 * n * n * evo.c_hidden_mul * b,
    }
    n_extra = data_preset.n_extra if extra.enabled else 0
    if msa_offload:  # on the device only in one block's MSA updates: the larger of the two
        evo_msa = resident.pop(next(k for k in resident if k.startswith("MSA representation")))
        resident["the MSA representation of one block and its update (offloaded between "
                 "blocks; the larger of the Evoformer's and the extra MSA stack's)"] = max(
            evo_msa, 2 * n_extra * n * extra.c_e * 4)
    if n_extra and msa_offload:
        transient[f"extra MSA row attention logits [N_extra, H={extra.no_heads_msa}, N_res, "
                  "N_res]"] = n_extra * extra.no_heads_msa * n * n * b
    elif n_extra:
        resident[f"extra MSA representation [N_extra={n_extra}, N_res, c_e={extra.c_e}] and its "
                 "update"] = 2 * n_extra * n * extra.c_e * 4
        transient[f"extra MSA row attention logits [N_extra, H={extra.no_heads_msa}, N_res, "
                  "N_res]"] = n_extra * extra.no_heads_msa * n * n * b
    fraction = 1.0 if chunk_size is None else min(1.0, chunk_size / n)
    if fused_attention:
        transient = _drop_logits(transient)
    return MemoryEstimate("AF2 prediction", f"N_res={n_res}, N_seq={n_seq}, N_extra={n_extra}, "
                          f"{precision}", resident, transient, fraction, chunkable=True)


def _pair_head_block(g: int, rows: int, n: int, c_z: int, bins: int) -> int:
    """fp32 bytes of the PAE / PDE heads on one row block of a sample group (the head reduces
    the logits to expected values there, :class:`fold_model.af3.confidence.ConfidenceHead`'s
    ``reduce_pair``): one layer-normed block of the pair ``[G, R, N, c_z]`` at a time (PAE,
    then the PDE's rows and columns) and the logits with a softmax and its product
    ``[G, R, N, bins]`` x 4."""
    return g * rows * n * (c_z + 4 * bins) * 4


def af3_estimate(size: InputSize, model_config, *, precision: str = "fp32",
                 no_samples: int | None = None, chunk_size: int | None = None,
                 sample_group: int | None = None, fused_attention: bool = False
                 ) -> MemoryEstimate:
    """An AF3 prediction of an input of ``size`` (tokens, atoms, MSA rows) with ``no_samples``
    diffusion samples (default: the model's); ``chunk_size``: the row chunk of the stacks
    (AutoChunk: its smallest chunk); ``sample_group``: samples through the diffusion network and
    the confidence head at a time; ``fused_attention``: no attention logits are stored
    (:func:`fused_attention`). For a per-stage estimate of the real model, see
    :mod:`fold_train.predict_plan` (``fold-train predict --dry-run``)."""
    n, n_atom, n_msa = size.n_tokens, size.n_atoms, size.n_msa_rows
    cfg = model_config
    s = no_samples or cfg.sampler.no_samples
    g = min(s, sample_group or s)  # samples the network holds at a time
    rows = 1.0 if chunk_size is None else min(1.0, chunk_size / max(n, 1))
    b = _bytes_per_value(precision)
    resident = {
        f"pair representation [N_token, N_token, c_z={cfg.c_z}], its update and the diffusion's "
        "pair conditioning": 3 * n * n * cfg.c_z * 4,
        f"MSA representation [N_msa={n_msa}, N_token, c_m={cfg.msa.c_m}] and its update":
            2 * n_msa * n * cfg.msa.c_m * 4,
        f"atom representations [G={g}, N_atom, c_atom={cfg.atom.c_atom}]":
            3 * g * n_atom * cfg.atom.c_atom * 4,
    }
    if chunk_size is None:  # DiffusionModule.prepare keeps every block's bias for the sampler
        resident[f"diffusion transformer pair biases [{cfg.diffusion.no_blocks}, "
                 f"H={cfg.diffusion.no_heads}, N_token, N_token]"] = \
            cfg.diffusion.no_blocks * cfg.diffusion.no_heads * n * n * b
    # chunked rows: the chunk's share of the logits; the diffusion attention chunks samples
    pair_rows = n if chunk_size is None else min(n, chunk_size)
    bins = max(cfg.confidence.pae_no_bins, cfg.confidence.pde_no_bins)
    att_rows = g if chunk_size is None else min(g, chunk_size)
    transient = {
        f"triangle attention logits [N_token, H={cfg.pairformer.no_heads_tri_att}, N_token, "
        "N_token]": int(cfg.pairformer.no_heads_tri_att * n ** 3 * b * rows),
        f"diffusion attention logits [G={att_rows}, H={cfg.diffusion.no_heads}, N_token, "
        "N_token]": att_rows * cfg.diffusion.no_heads * n * n * b,
        f"outer product mean [N_token, N_token, {cfg.msa.c_hidden_opm}, "
        f"{cfg.msa.c_hidden_opm}]": int(n * n * cfg.msa.c_hidden_opm ** 2 * b * rows),
        f"triangle multiplication [4, N_token, N_token, {cfg.pairformer.c_hidden_mul}]":
            4 * n * n * cfg.pairformer.c_hidden_mul * b,
        # Alg. 21 lines 1-3 (concatenation, LayerNorm, two transitions): 9 c_z values per pair
        # at its peak, counted on FakeTensors at 4096 tokens (docs/memory.md); row blocks
        f"diffusion pair conditioning [N_token, N_token, 9 c_z={9 * cfg.c_z}]":
            int(9 * n * n * cfg.c_z * 4 * rows),
        f"confidence head pair [G={g}, N_token, N_token, c_z] and its update, PAE/PDE logits "
        f"of one row block [G, R={pair_rows}, N_token, {bins}], the reduced pair confidences "
        f"[S={s}, 4, N_token, N_token]":
            2 * g * n * n * cfg.c_z * 4 + _pair_head_block(g, pair_rows, n, cfg.c_z, bins)
            + 4 * s * n * n * 4,
    }
    if fused_attention:
        transient = _drop_logits(transient)
    what = f"{s} samples" + (f" in groups of {g}" if g < s else "")
    return MemoryEstimate("AF3 prediction", f"N_token={n}, N_atom={n_atom}, N_msa={n_msa}, "
                          f"{what}, {precision}" + (f", chunk {chunk_size}" if chunk_size else ""),
                          resident, transient, chunkable=True)


def budget_bytes(device: torch.device | str, memory_limit: int | None = None,
                 memory: Callable[[torch.device], int] | None = None) -> int:
    """The bytes a prediction may use on ``device``: ``memory_limit`` when given, else
    ``memory(device)`` (default: the free memory, ``fold_train.autochunk.available_memory``)."""
    if memory_limit is not None:
        return int(memory_limit)
    if memory is None:
        from fold_train.autochunk import available_memory as memory
    return int(memory(torch.device(device)))




def check_memory(est: MemoryEstimate, budget: int, *, source: str, device: str,
                 options: list[str]) -> None:
    """Refuse ``est`` (:class:`InputTooLarge` naming ``source``) when its peak exceeds
    ``budget`` bytes, listing the numbers and ``options`` (what the user can change; chunking
    is suggested when it would fit); warn (:class:`SizeWarning`) above 80% of the budget."""
    name, largest = est.largest_transient
    resident = est.resident_bytes
    head = (f"{est.what} ({est.shape}) needs about {format_bytes(est.peak_bytes)} of memory but "
            f"{format_bytes(budget)} is available on {device}")
    parts = "; ".join(f"{k}: {format_bytes(v)}" for k, v in est.resident.items())
    if est.peak_bytes <= budget:
        if est.peak_bytes > WARN_FRACTION * budget:
            warnings.warn(f"{source}: {head.replace(' but ', ', and ')}: it may not fit "
                          f"(largest part: {name}, {format_bytes(largest)})", SizeWarning,
                          stacklevel=3)
        return
    hints = list(options)
    if resident > budget:
        why = (f"what stays resident through the trunk alone is {format_bytes(resident)} "
               f"({parts}), which no chunking reduces")
    else:
        why = (f"its largest intermediate is {name}, {format_bytes(largest * est.chunk_fraction)}"
               f"{' with this chunking' if est.chunk_fraction < 1 else ''}, on top of "
               f"{format_bytes(resident)} resident")
        if est.chunkable and est.chunk_fraction == 1.0:
            hints.insert(0, "chunk it: --autochunk auto (or --chunk-size 64, smaller for less "
                            "memory)")
        elif est.chunkable:
            hints.insert(0, "a smaller --chunk-size (or --autochunk with a smaller "
                            "--autochunk-min-chunk)")
    raise InputTooLarge(source, "size", f"input too large for this device: {head}; {why}. "
                        f"Options: {'; '.join(hints)}")
