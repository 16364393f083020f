"""Blocks of fold and of its peers (OpenFold, Protenix, Boltz) at matching sizes, for
benchmarks/model/peers.py.

Each builder returns a :class:`Case`: the module, its leaf inputs (activations that require
grad), and ``forward()`` that calls the block the way its users call it, flags included, and
returns the block's outputs as a tuple. All contenders get the same input values and masks (drawn
from one seed); each gets its own leaf tensors so that gradients never mix.

Sizes: AF3 Pairformer c_s 384, c_z 128, 16 single heads, triangle attention 4 x 32, triangle
multiplication 128, transition 4, dropout 0.25; AF3 diffusion transformer block c_token 768,
c_s 384, c_z 128, 16 heads, transition 2; AF2 Evoformer c_m 256, c_z 128 (AF2 supplement 1.6).
fold's sizes come from its presets (``af3``, ``af2_initial``; ``tiny`` for the CPU smoke) and the
peers are built with the same numbers.

Peers run as their users train them: the call under ``torch.autocast(bfloat16)`` on CUDA (cache
off, as CUDA-graph capture requires), parameters and input activations in ``--peer-weights``
(by default fold's precision: benchmarks/model/peers.py): fp32, as in bf16-mixed training
(Lightning's, which Boltz and OpenFold use; Protenix likewise autocasts an fp32 model), where
matrix products run in bf16 and the residual stream stays fp32; or bf16 throughout. fold runs
in one of :data:`FOLD_PRECISIONS`: ``bf16`` (bf16 parameters and inputs, no autocast: its block
benchmarks), ``mixed`` (fp32 parameters and inputs under bf16 autocast: how ``fold-train
predict`` runs every stack, and ``fold-train train`` with ``precision=bf16``) or
``mixed-bf16-weights`` (bf16 parameters, fp32 inputs, bf16 autocast: the AF3 trunk stacks under
``system.bf16_weights=true``, whose pair and single streams stay fp32).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from benchmarks.common.blocks import token_mask


@dataclass
class Case:
    """A block ready to time: ``forward()`` -> tuple of outputs; ``inputs`` are its leaves."""

    module: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    forward: Callable[[], tuple[torch.Tensor, ...]]
    note: str = ""
    params: list[torch.Tensor] = field(default_factory=list)

    def __post_init__(self):
        self.params = [p for p in self.module.parameters() if p.requires_grad]


@dataclass(frozen=True)
class Shape:
    """One benchmark row: ``block`` in {evoformer, pairformer, diffusion}; ``n`` = N_res or
    N_token; ``n_seq`` (Evoformer) or ``samples`` (diffusion)."""

    block: str
    n: int
    n_seq: int = 0
    samples: int = 0

    def label(self) -> str:
        if self.block == "evoformer":
            return f"evoformer N_seq {self.n_seq} N_res {self.n}"
        if self.block == "diffusion":
            return f"diffusion N_token {self.n} samples {self.samples}"
        return f"pairformer N_token {self.n}"


# ---------------------------------------------------------------------------------------------
# Shared inputs


def base_inputs(shape: Shape, sizes: dict[str, int], mask: str = "holes"
                ) -> dict[str, torch.Tensor]:
    """The values every contender of ``shape`` receives (fp32, CPU; cast per contender);
    ``mask``: the token mask's pattern."""
    gen = torch.Generator().manual_seed(0)
    n = shape.n
    mask = token_mask(n, gen, "cpu", mask)  # [1, N], the first token kept
    out = {"mask": mask, "pair_mask": mask[:, :, None] * mask[:, None]}
    if shape.block == "evoformer":
        out["m"] = torch.randn(1, shape.n_seq, n, sizes["c_m"], generator=gen)
        out["z"] = torch.randn(1, n, n, sizes["c_z_evo"], generator=gen)
        seq = (torch.rand(1, shape.n_seq, 1, generator=gen) > 0.05).float()
        seq[:, 0] = 1
        out["msa_mask"] = seq * mask[:, None, :]  # [1, N_seq, N_res]
    elif shape.block == "pairformer":
        out["s"] = torch.randn(1, n, sizes["c_s"], generator=gen)
        out["z"] = torch.randn(1, n, n, sizes["c_z"], generator=gen)
    else:
        out["a"] = torch.randn(1, shape.samples, n, sizes["c_token"], generator=gen)
        out["s"] = torch.randn(1, shape.samples, n, sizes["c_s"], generator=gen)
        out["z"] = torch.randn(1, n, n, sizes["c_z"], generator=gen)
    return out


def output_grads(outs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Fixed random gradients for the outputs: the same values for every contender whose
    outputs have the same sizes, whatever their layout (``randn(numel)`` from seed 1)."""
    gen = torch.Generator().manual_seed(1)
    return tuple(torch.randn(o.numel(), generator=gen).view(o.shape).to(o.device, o.dtype)
                 for o in outs)


def _leaf(t: torch.Tensor, device, dtype) -> torch.Tensor:
    return t.to(device, dtype).requires_grad_(True)


def _autocast(device: torch.device):
    """bf16 autocast on CUDA, without the weight-cast cache (CUDA-graph capture needs it off)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)


# ---------------------------------------------------------------------------------------------
# fold


def fold_sizes(tiny: bool) -> dict[str, int]:
    from fold_model.af2 import config as af2_config
    from fold_model.af3.config import config as af3_config

    c3 = af3_config("tiny" if tiny else "af3")
    ev = af2_config("tiny" if tiny else "af2_initial").evoformer
    p, d = c3.pairformer, c3.diffusion
    return dict(
        c_s=c3.c_s, c_z=c3.c_z, c_hidden_mul=p.c_hidden_mul, c_hidden_tri_att=p.c_hidden_tri_att,
        no_heads_tri_att=p.no_heads_tri_att, no_heads_single=p.no_heads_single,
        transition_n=p.transition_n, dropout=p.dropout, c_token=d.c_token,
        no_heads_diff=d.no_heads, transition_n_diff=d.transition_n,
        c_m=ev.c_m, c_z_evo=ev.c_z, c_hidden_msa_att=ev.c_hidden_msa_att,
        no_heads_msa=ev.no_heads_msa, c_hidden_opm=ev.c_hidden_opm,
        c_hidden_mul_evo=ev.c_hidden_mul, c_hidden_pair_att=ev.c_hidden_pair_att,
        no_heads_pair=ev.no_heads_pair, transition_n_evo=ev.transition_n,
        msa_dropout=ev.msa_dropout, pair_dropout=ev.pair_dropout,
    )


# fold's precision settings: (parameter dtype, input dtype, autocast) on CUDA
FOLD_PRECISIONS = {"bf16": (torch.bfloat16, torch.bfloat16, False),
                   "mixed": (torch.float32, torch.float32, True),
                   "mixed-bf16-weights": (torch.bfloat16, torch.float32, True)}


def build_fold(shape: Shape, sizes, x, device, precision: str, tiny: bool) -> Case:
    """fold's block as benchmarks/model/af3_blocks.py and model/evoformer.py build it, in
    ``precision`` (:data:`FOLD_PRECISIONS`; fp32 without autocast on the CPU)."""
    weights, dtype, mixed = FOLD_PRECISIONS[precision]
    if device.type != "cuda":
        weights, dtype, mixed = torch.float32, torch.float32, False
    case = _build_fold(shape, sizes, x, device, weights, dtype, tiny)
    if not mixed:
        return case
    inner = case.forward

    def forward():
        with _autocast(device):
            return inner()
    note = f"{precision}: {weights} weights, {dtype} inputs, bf16 autocast"
    return Case(case.module, case.inputs, forward, "; ".join(filter(None, (case.note, note))))


def _build_fold(shape: Shape, sizes, x, device, weights, dtype, tiny: bool) -> Case:
    torch.manual_seed(0)
    if shape.block == "evoformer":
        from fold_model.af2 import config as af2_config
        from fold_model.af2.evoformer import make_block

        cfg = af2_config("tiny" if tiny else "af2_initial").evoformer
        block = make_block(cfg, cfg.c_m, cfg.c_z, "af2")
        args = (_leaf(x["m"], device, dtype), _leaf(x["z"], device, dtype))
        masks = (x["msa_mask"].to(device, dtype), x["pair_mask"].to(device, dtype))
        block = block.to(device, weights).train()
        return Case(block, args, lambda: tuple(block(*args, *masks)), "order af2")
    from fold_model.af3.diffusion import DiffusionTransformerBlock
    from fold_model.af3.pairformer import PairformerBlock

    mask = x["mask"].to(device, dtype)
    if shape.block == "pairformer":
        block = PairformerBlock(sizes["c_s"], sizes["c_z"], sizes["c_hidden_mul"],
                                sizes["c_hidden_tri_att"], sizes["no_heads_tri_att"],
                                sizes["no_heads_single"], sizes["transition_n"], sizes["dropout"])
        args = (_leaf(x["s"], device, dtype), _leaf(x["z"], device, dtype))
        pair_mask = x["pair_mask"].to(device, dtype)
        block = block.to(device, weights).train()
        return Case(block, args, lambda: tuple(block(*args, mask, pair_mask)))
    block = DiffusionTransformerBlock(sizes["c_token"], sizes["c_s"], sizes["c_z"],
                                      sizes["no_heads_diff"], sizes["transition_n_diff"])
    args = (_leaf(x["a"], device, dtype), _leaf(x["s"], device, dtype),
            _leaf(x["z"], device, dtype))
    block = block.to(device, weights).train()
    return Case(block, args, lambda: (block(*args, mask),))


# ---------------------------------------------------------------------------------------------
# Peers. Each is imported only when asked for; ImportError -> the row says "not installed".


def _rdkit_for_protenix_constants() -> str:
    """protenix.model.modules.pairformer imports protenix.data.constants, which imports RDKit
    (36 MB, over the carry budget) only to list element symbols when the module loads; no block
    calls it. Where RDKit is missing, ``rdkit.Chem.GetPeriodicTable`` is given a module that
    answers placeholder symbols for that listing and nothing else (nothing timed touches it)."""
    if isinstance(getattr(sys.modules.get("rdkit.Chem"), "GetPeriodicTable", None), type):
        return _RDKIT_NOTE  # ours, from an earlier row
    try:
        importlib.import_module("rdkit.Chem")
        return ""
    except ImportError:
        pass

    class _Table:
        def GetElementSymbol(self, z: int) -> str:  # noqa: N802 (RDKit's name)
            return f"E{z}"

    rdkit = types.ModuleType("rdkit")
    chem = types.ModuleType("rdkit.Chem")
    chem.GetPeriodicTable = _Table  # type: ignore[attr-defined]
    rdkit.Chem = chem  # type: ignore[attr-defined]
    sys.modules["rdkit"], sys.modules["rdkit.Chem"] = rdkit, chem
    return _RDKIT_NOTE


_RDKIT_NOTE = "rdkit absent: protenix.data.constants' element list made from placeholder symbols"


def peer_version(dist: str) -> str:
    if dist == "openfold":  # a source tree, no distribution: peer_setup.sh exports its commit
        importlib.import_module("openfold")
        return os.environ.get("PEERS_OPENFOLD_COMMIT") or "unknown commit"
    return importlib.metadata.version(dist)


def _peer_cast(block: torch.nn.Module, device, weights: torch.dtype) -> torch.nn.Module:
    return block.to(device, weights).train()


def build_protenix(shape: Shape, sizes, x, device, weights, kernels: bool,
                   layernorm: str) -> Case:
    """Protenix 2.0 PairformerBlock / DiffusionTransformerBlock.

    Kernels on: ``triangle_attention="cuequivariance"``, ``triangle_multiplicative=
    "cuequivariance"`` (its documented flags). LayerNorm: ``LAYERNORM_TYPE`` (its env switch,
    ``fast_layernorm`` by default: its CUDA LayerNorm). The diffusion block has no token mask in
    Protenix (``AttentionPairBias`` takes none) and gets z as ``[1, 1, N, N, C_z]`` (shared by the
    samples); Protenix's training config keeps ``enable_efficient_fusion`` off."""
    os.environ["LAYERNORM_TYPE"] = layernorm
    note = _rdkit_for_protenix_constants()
    from protenix.model.modules.pairformer import PairformerBlock
    from protenix.model.modules.transformer import DiffusionTransformerBlock

    torch.manual_seed(0)
    act = weights  # activations as the parameters: see the module docstring
    flag = "cuequivariance" if kernels else "torch"
    if shape.block == "pairformer":
        block = _peer_cast(PairformerBlock(
            n_heads=sizes["no_heads_single"], c_z=sizes["c_z"], c_s=sizes["c_s"],
            c_hidden_mul=sizes["c_hidden_mul"], c_hidden_pair_att=sizes["c_hidden_tri_att"],
            no_heads_pair=sizes["no_heads_tri_att"], num_intermediate_factor=sizes["transition_n"],
            dropout=sizes["dropout"]), device, weights)
        args = (_leaf(x["s"], device, act), _leaf(x["z"], device, act))
        pair_mask = x["pair_mask"].to(device, act)

        def forward():
            with _autocast(device):
                return tuple(block(args[0], args[1], pair_mask, triangle_multiplicative=flag,
                                   triangle_attention=flag))
        return Case(block, args, forward, note)
    if shape.block != "diffusion":
        raise ValueError(f"Protenix has no {shape.block} block")
    block = _peer_cast(DiffusionTransformerBlock(
        c_a=sizes["c_token"], c_s=sizes["c_s"], c_z=sizes["c_z"],
        n_heads=sizes["no_heads_diff"]), device, weights)
    args = (_leaf(x["a"], device, act), _leaf(x["s"], device, act),
            _leaf(x["z"][:, None], device, act))

    def forward():
        with _autocast(device):
            return (block(*args)[0],)
    return Case(block, args, forward, "no token mask (Protenix's block takes none)"
                + (f"; {note}" if note else ""))


def build_boltz(shape: Shape, sizes, x, device, weights, kernels: bool) -> Case:
    """Boltz 2.2 ``PairformerLayer(v2=True)`` (Boltz-2's trunk) with ``use_kernels`` (its
    cuEquivariance triangle kernels), and Boltz-2's ``DiffusionTransformerLayer``
    (transformersv2), which takes the pair bias ``[1, N, N, H]`` precomputed (Boltz-2 projects z
    to all 24 layers' biases once per trunk, outside the layers) and the samples as
    ``multiplicity``; it has no kernel flag."""
    from boltz.model.layers.pairformer import PairformerLayer
    from boltz.model.modules.transformersv2 import DiffusionTransformerLayer

    torch.manual_seed(0)
    act = weights  # activations as the parameters: see the module docstring
    if shape.block == "pairformer":
        block = _peer_cast(PairformerLayer(
            sizes["c_s"], sizes["c_z"], num_heads=sizes["no_heads_single"],
            dropout=sizes["dropout"], pairwise_head_width=sizes["c_hidden_tri_att"],
            pairwise_num_heads=sizes["no_heads_tri_att"], v2=True), device, weights)
        args = (_leaf(x["s"], device, act), _leaf(x["z"], device, act))
        mask, pair_mask = x["mask"].to(device, act), x["pair_mask"].to(device, act)

        def forward():
            with _autocast(device):
                return tuple(block(args[0], args[1], mask, pair_mask, use_kernels=kernels))
        return Case(block, args, forward)
    if shape.block != "diffusion":
        raise ValueError(f"Boltz has no {shape.block} block")
    if kernels:
        raise ValueError("Boltz's diffusion transformer has no kernel flag")
    block = _peer_cast(DiffusionTransformerLayer(
        heads=sizes["no_heads_diff"], dim=sizes["c_token"], dim_single_cond=sizes["c_s"]),
        device, weights)
    s, n = shape.samples, shape.n
    gen = torch.Generator().manual_seed(2)
    bias = torch.randn(1, n, n, sizes["no_heads_diff"], generator=gen)
    args = (_leaf(x["a"].reshape(s, n, -1), device, act),
            _leaf(x["s"].reshape(s, n, -1), device, act), _leaf(bias, device, act))
    mask = x["mask"].expand(s, n).to(device, act)

    def forward():
        with _autocast(device):
            return (block(args[0], args[1], args[2], mask, multiplicity=s),)
    return Case(block, args, forward, "pair bias precomputed (as Boltz-2 does once per trunk); "
                "its transition has one more c_token x 2c_token projection (a_to_b)")


def build_openfold(shape: Shape, sizes, x, device, weights, kernels: bool) -> Case:
    """OpenFold's ``EvoformerBlock`` (AF2 order) with its AF2 config values. "Kernels off" is
    OpenFold as its default install runs it, in PyTorch: its own in-place softmax CUDA extension
    (``attn_core_inplace_cuda``, built by peer_setup.sh) is imported with OpenFold, but
    ``EvoformerBlock`` passes ``use_memory_efficient_kernel=False`` to its MSA row attention
    (only ``ExtraMSABlock`` calls the extension).
    "Kernels on" would be DeepSpeed's DS4Sci EvoformerAttention, which is not installed."""
    if shape.block != "evoformer":
        raise ValueError(f"OpenFold is benchmarked on the Evoformer only, not {shape.block}")
    if kernels:
        raise ImportError("OpenFold's kernels need DeepSpeed (DS4Sci_EvoformerAttention), "
                          "which is not installed")
    from openfold.model.evoformer import EvoformerBlock

    torch.manual_seed(0)
    act = weights  # activations as the parameters: see the module docstring
    block = _peer_cast(EvoformerBlock(
        c_m=sizes["c_m"], c_z=sizes["c_z_evo"], c_hidden_msa_att=sizes["c_hidden_msa_att"],
        c_hidden_opm=sizes["c_hidden_opm"], c_hidden_mul=sizes["c_hidden_mul_evo"],
        c_hidden_pair_att=sizes["c_hidden_pair_att"], no_heads_msa=sizes["no_heads_msa"],
        no_heads_pair=sizes["no_heads_pair"], transition_n=sizes["transition_n_evo"],
        msa_dropout=sizes["msa_dropout"], pair_dropout=sizes["pair_dropout"],
        no_column_attention=False, opm_first=False, fuse_projection_weights=False, inf=1e9,
        eps=1e-8), device, weights)
    args = (_leaf(x["m"], device, act), _leaf(x["z"], device, act))
    masks = (x["msa_mask"].to(device, act), x["pair_mask"].to(device, act))

    def forward():
        with _autocast(device):
            return tuple(block(args[0], args[1], *masks, chunk_size=None))
    return Case(block, args, forward)


# contender name -> (distribution for the version, blocks it has, kernel settings it offers)
PEERS = {
    "protenix": ("protenix", ("pairformer", "diffusion"), {"pairformer": (True, False),
                                                           "diffusion": (False,)}),
    "boltz": ("boltz", ("pairformer", "diffusion"), {"pairformer": (True, False),
                                                     "diffusion": (False,)}),
    "openfold": ("openfold", ("evoformer",), {"evoformer": (True, False)}),
}
