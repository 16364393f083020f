"""Protenix checkpoints (``.pt``) as fold AF3 state dicts.

Protenix (ByteDance, Apache-2.0) is a PyTorch AF3 whose checkpoints are a ``torch.save`` of
``{"model": state_dict, ...}`` (names prefixed ``module.`` when saved from DDP; its
``runner/inference.py`` strips the prefix the same way). :func:`load_protenix_checkpoint` reads
such a file, derives fold's :class:`~fold_model.af3.config.AlphaFold3Config` from the tensor
shapes (:func:`protenix_config`) and renames and reshapes every tensor into fold's names
(:func:`convert_protenix_state`): no Protenix tensor is left over and every fold tensor is
filled, either from Protenix or, where fold has a parameter Protenix lacks (the biases of
projections Protenix has without, the LayerNorm offsets it creates without), with the value
that makes fold compute what Protenix computes (0, or 1 for a scale).

Layout changes: Protenix's two SwiGLU input projections (``linear_no_bias_a`` / ``_b``, or
``linear_nobias_a1`` / ``_a2``) are stacked into fold's one ``linear_ab``; the atom encoder's three
input projections (``ref_pos``, ``arcsinh(ref_charge)``, ``[ref_mask, element, name chars]``) are
fold's one ``linear_feat`` over the concatenated features; the template embedder's input
projection has its columns reordered (Protenix concatenates ``restype_j`` before ``restype_i`` and
the unit vector last); Protenix's distogram head is ``Linear(z) + Linear(z)^T``, fold's
``Linear(z + z^T)``, so fold's bias is twice Protenix's.

The model semantics that Protenix's weights depend on and that differ from AF3's released code
are switched on in the returned config (``atom.key_norm="query"``, ``z_init_from="s_init"``,
``confidence.variant="protenix"``); the featurizer differences are listed in docs/weights.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import torch

from fold_model.af3.config import (
    AlphaFold3Config,
    AtomAttentionConfig,
    ConfidenceConfig,
    DiffusionConfig,
    MSAModuleConfig,
    PairformerConfig,
    RelPosConfig,
    TemplateConfig,
)

__all__ = [
    "ProtenixParamsError",
    "read_protenix_checkpoint",
    "protenix_config",
    "convert_protenix_state",
    "convert_protenix_module",
    "load_protenix_checkpoint",
]

# Protenix's inference settings that are not in its weights (configs/configs_base.py and
# configs_model_type.py of Protenix 2.0): 10 trunk cycles for the v1.0 / v2 models; atom windows
# of 32 queries and 128 keys.
PROTENIX_NO_CYCLES = 10
PROTENIX_N_QUERIES = 32
PROTENIX_N_KEYS = 128
PROTENIX_DISTOGRAM_EDGES = (2.3125, 21.6875)


class ProtenixParamsError(ValueError):
    """A Protenix checkpoint that cannot be read or mapped; the message names the file."""


def read_protenix_checkpoint(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The model state dict of a Protenix checkpoint ``{"model": ...}`` (or a bare state dict),
    ``module.`` prefixes removed. Only tensors and plain containers are unpickled
    (``weights_only``)."""
    try:
        obj = torch.load(os.fspath(path), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (torch raises many kinds for a bad file)
        raise ProtenixParamsError(f"{path}: not a readable Protenix checkpoint "
                                  f"(torch.load with weights_only: {e})") from e
    state = obj.get("model", obj) if isinstance(obj, Mapping) else None
    if not isinstance(state, Mapping) or not state or not all(
            isinstance(v, torch.Tensor) for v in state.values()):
        raise ProtenixParamsError(f"{path}: expected a dict with a 'model' state dict of "
                                  f"tensors (Protenix's checkpoint format)")
    return {k.removeprefix("module."): v for k, v in state.items()}


# -- sizes ----------------------------------------------------------------------------------------

def _count(state: Mapping[str, torch.Tensor], prefix: str) -> int:
    """Number of ``prefix<i>.`` blocks."""
    pat = re.compile(re.escape(prefix) + r"(\d+)\.")
    return len({m.group(1) for k in state if (m := pat.match(k))})


def _pair_sizes(state, p: str, c_z: int) -> dict[str, int]:
    """Triangle and transition sizes of the Protenix pair block at ``p``."""
    heads = state[p + "tri_att_start.linear.weight"].shape[0]
    return {
        "c_hidden_mul": state[p + "tri_mul_out.linear_a_p.weight"].shape[0],
        "c_hidden_tri_att": state[p + "tri_att_start.mha.linear_q.weight"].shape[0] // heads,
        "no_heads_tri_att": heads,
        "transition_n": state[p + "pair_transition.linear_no_bias_a.weight"].shape[0] // c_z,
    }


def protenix_config(state: Mapping[str, torch.Tensor], path: str = "<state>"
                    ) -> AlphaFold3Config:
    """fold's AF3 config for a Protenix state dict, every size read from a tensor shape."""
    try:
        return _protenix_config(state)
    except ProtenixParamsError as e:
        raise ProtenixParamsError(f"{path}: {e}") from e
    except KeyError as e:
        raise ProtenixParamsError(f"{path}: no tensor {e.args[0]!r}; not a Protenix AF3 "
                                  f"checkpoint (or a version this importer does not know)") from e


def _protenix_config(state: Mapping[str, torch.Tensor]) -> AlphaFold3Config:
    c_s, c_s_inputs = state["linear_no_bias_sinit.weight"].shape
    c_z = state["linear_no_bias_zinit1.weight"].shape[0]
    ie = "input_embedder.atom_attention_encoder."
    atoms = {}
    for name, p in (("input", ie), ("encoder", "diffusion_module.atom_attention_encoder."),
                    ("decoder", "diffusion_module.atom_attention_decoder.")):
        blocks = p + "atom_transformer.diffusion_transformer.blocks."
        atoms[name] = (_count(state, blocks),
                       state[blocks + "0.attention_pair_bias.linear_nobias_z.weight"].shape[0])
    if len(set(atoms.values())) != 1:
        raise ProtenixParamsError(f"atom transformers of different depth / heads {atoms}: fold's "
                                  f"AF3 has one atom attention config for all three")
    atom_blocks, atom_heads = atoms["input"]
    atom = AtomAttentionConfig(
        c_atom=state[ie + "linear_no_bias_f.weight"].shape[0],
        c_atompair=state[ie + "linear_no_bias_d.weight"].shape[0],
        no_blocks=atom_blocks, no_heads=atom_heads, n_queries=PROTENIX_N_QUERIES,
        n_keys=PROTENIX_N_KEYS, max_atoms_per_token=state["confidence_head.plddt_weight"].shape[0]
        if "confidence_head.plddt_weight" in state else 24, key_norm="query")
    rel_in = state["relative_position_encoding.linear_no_bias.weight"].shape[1]
    relpos = RelPosConfig(r_max=(rel_in - 11) // 4, s_max=2)  # 4 r_max + 2 s_max + 7 features

    t = "template_embedder."
    t_blocks = _count(state, t + "pairformer_stack.blocks.")
    if t_blocks:
        c_t = state[t + "linear_no_bias_z.weight"].shape[0]
        template = TemplateConfig(enabled=True, c_t=c_t, no_blocks=t_blocks,
                                  **_pair_sizes(state, t + "pairformer_stack.blocks.0.", c_t))
    else:
        template = TemplateConfig(enabled=False)

    m = "msa_module."
    c_m = state[m + "linear_no_bias_m.weight"].shape[0]
    pwa = m + "blocks.0.msa_stack.msa_pair_weighted_averaging."
    msa_blocks = _count(state, m + "blocks.")
    pair_avg_heads = state[pwa + "linear_no_bias_z.weight"].shape[0] if msa_blocks > 1 else 8
    msa = MSAModuleConfig(
        c_m=c_m, no_blocks=msa_blocks,
        c_hidden_opm=state[m + "blocks.0.outer_product_mean_msa.linear_1.weight"].shape[0],
        c_hidden_pair_avg=(state[pwa + "linear_no_bias_mv.weight"].shape[0] // pair_avg_heads
                           if msa_blocks > 1 else 8),
        no_heads_pair_avg=pair_avg_heads,
        **_pair_sizes(state, m + "blocks.0.pair_stack.", c_z),
    )
    if msa_blocks > 1:
        n_msa = state[m + "blocks.0.msa_stack.transition_m.linear_no_bias_a.weight"].shape[0]
        if n_msa // c_m != msa.transition_n:
            raise ProtenixParamsError(f"MSA transition {n_msa // c_m}x and pair transition "
                                      f"{msa.transition_n}x differ: fold's MSA module has one")

    pf = "pairformer_stack.blocks.0."
    pairformer = PairformerConfig(
        no_blocks=_count(state, "pairformer_stack.blocks."),
        no_heads_single=state[pf + "attention_pair_bias.linear_nobias_z.weight"].shape[0],
        **_pair_sizes(state, pf, c_z))
    n_single = state[pf + "single_transition.linear_no_bias_a.weight"].shape[0] // c_s
    if n_single != pairformer.transition_n:
        raise ProtenixParamsError(f"Pairformer single transition {n_single}x and pair transition "
                                  f"{pairformer.transition_n}x differ: fold's Pairformer has one")

    d = "diffusion_module."
    c_token = state[d + "linear_no_bias_s.weight"].shape[0]
    db = d + "diffusion_transformer.blocks.0."
    diffusion = DiffusionConfig(
        c_token=c_token, no_blocks=_count(state, d + "diffusion_transformer.blocks."),
        no_heads=state[db + "attention_pair_bias.linear_nobias_z.weight"].shape[0],
        c_fourier=state[d + "diffusion_conditioning.fourier_embedding.w"].shape[0],
        conditioning_transition_n=state[
            d + "diffusion_conditioning.transition_z1.linear_no_bias_a.weight"].shape[0] // c_z,
        transition_n=state[db + "conditioned_transition_block.linear_nobias_a1.weight"
                           ].shape[0] // c_token)

    c = "confidence_head."
    if c + "plddt_weight" in state:
        cp = c + "pairformer_stack.blocks.0."
        theirs = (state[cp + "attention_pair_bias.linear_nobias_z.weight"].shape[0],
                  _pair_sizes(state, cp, c_z))
        ours = (pairformer.no_heads_single, _pair_sizes(state, pf, c_z))
        if theirs != ours:
            raise ProtenixParamsError(f"confidence head Pairformer sizes {theirs} differ from the "
                                      f"trunk's {ours}: fold's AF3 builds both from one config")
        lower = state[c + "lower_bins"]
        confidence = ConfidenceConfig(
            enabled=True, no_blocks=_count(state, c + "pairformer_stack.blocks."),
            distance_min_bin=float(lower[0]), distance_max_bin=float(lower[-1]),
            distance_no_bins=lower.shape[0],
            plddt_no_bins=state[c + "plddt_weight"].shape[-1],
            pae_no_bins=state[c + "linear_no_bias_pae.weight"].shape[0],
            pde_no_bins=state[c + "linear_no_bias_pde.weight"].shape[0],
            resolved_no_bins=state[c + "resolved_weight"].shape[-1], variant="protenix")
    else:
        confidence = ConfidenceConfig(enabled=False)
    cfg = AlphaFold3Config(
        c_s=c_s, c_z=c_z, c_token_input=c_s_inputs - 65, atom=atom, relpos=relpos,
        template=template, msa=msa, pairformer=pairformer, diffusion=diffusion,
        confidence=confidence, no_cycles=PROTENIX_NO_CYCLES, z_init_from="s_init")
    # the distogram head's bins (Protenix's loss config, AF3's code: 64 bins, 63 edges from
    # 2.3125 to 21.6875 A): what its logits mean, so what fine-tuning must bin against
    cfg.loss.distogram_no_bins = state["distogram_head.linear.weight"].shape[0]
    cfg.loss.distogram_min_bin, cfg.loss.distogram_max_bin = PROTENIX_DISTOGRAM_EDGES
    return cfg


# -- names ----------------------------------------------------------------------------------------

class _Mapper:
    """Moves Protenix tensors (``take``) into fold names (``put``), remembering what was used."""

    def __init__(self, src: Mapping[str, torch.Tensor]) -> None:
        self.src = src
        self.used: set[str] = set()
        self.out: dict[str, torch.Tensor] = {}
        self.filled: set[str] = set()  # fold names given a neutral value Protenix has no tensor for

    def take(self, key: str) -> torch.Tensor:
        self.used.add(key)
        return self.src[key]

    def has(self, key: str) -> bool:
        return key in self.src

    def put(self, key: str, value: torch.Tensor) -> None:
        self.out[key] = value

    def fill(self, key: str, value: torch.Tensor) -> None:
        self.out[key] = value
        self.filled.add(key)

    # building blocks ---------------------------------------------------------------------------
    def linear(self, f: str, p: str) -> None:
        """``f.weight`` (and ``f.bias``: Protenix's or 0) from ``p``."""
        w = self.take(p + "weight")
        self.put(f + "weight", w)
        if self.has(p + "bias"):
            self.put(f + "bias", self.take(p + "bias"))
        else:
            self.fill(f + "bias", w.new_zeros(w.shape[0]))

    def layer_norm(self, f: str, p: str, width: int) -> None:
        """A fold LayerNorm (weight and bias) from a Protenix one with or without either."""
        ref = self.src[p + "weight"] if self.has(p + "weight") else self.src[p + "bias"]
        for name, neutral in (("weight", ref.new_ones(width)), ("bias", ref.new_zeros(width))):
            if self.has(p + name):
                self.put(f + name, self.take(p + name))
            else:
                self.fill(f + name, neutral)

    def stacked(self, f: str, *ps: str) -> None:
        """fold's one projection from Protenix's several, stacked along the output."""
        self.put(f, torch.cat([self.take(p) for p in ps], dim=0))

    def swiglu(self, f: str, p: str, width: int) -> None:
        self.layer_norm(f + "layer_norm.", p + "layernorm1.", width)
        self.stacked(f + "linear_ab.weight", p + "linear_no_bias_a.weight",
                     p + "linear_no_bias_b.weight")
        self.put(f + "linear_out.weight", self.take(p + "linear_no_bias.weight"))

    def mha(self, f: str, p: str) -> None:
        for name in ("q", "k", "v", "g", "o"):
            self.linear(f"{f}linear_{name}.", f"{p}linear_{name}.")

    def pair_updates(self, f: str, p: str, c_z: int) -> None:
        for tri in ("tri_mul_out", "tri_mul_in"):
            ff, pp = f + tri + ".", p + tri + "."
            c_hidden = self.src[pp + "linear_a_p.weight"].shape[0]
            self.layer_norm(ff + "layer_norm_in.", pp + "layer_norm_in.", c_z)
            for name in ("a_p", "a_g", "b_p", "b_g", "g", "z"):
                self.linear(f"{ff}linear_{name}.", f"{pp}linear_{name}.")
            self.layer_norm(ff + "layer_norm_out.", pp + "layer_norm_out.", c_hidden)
        for tri in ("tri_att_start", "tri_att_end"):
            ff, pp = f + tri + ".", p + tri + "."
            self.layer_norm(ff + "layer_norm.", pp + "layer_norm.", c_z)
            self.put(ff + "linear_bias.weight", self.take(pp + "linear.weight"))
            self.mha(ff + "mha.", pp + "mha.")
        self.swiglu(f + "pair_transition.", p + "pair_transition.", c_z)

    def ada_ln(self, f: str, p: str) -> None:
        self.put(f + "s_weight", self.take(p + "layernorm_s.weight"))
        self.stacked(f + "linear_gate_shift.weight", p + "linear_s.weight",
                     p + "linear_nobias_s.weight")
        self.put(f + "gate_bias", self.take(p + "linear_s.bias"))

    def attention_pair_bias(self, f: str, p: str, c_a: int, c_z: int) -> None:
        if self.has(p + "layernorm_a.linear_s.weight"):  # conditioned (AdaLN, output gate)
            self.ada_ln(f + "ada_ln.", p + "layernorm_a.")
            self.linear(f + "linear_s_gate.", p + "linear_a_last.")
        else:
            self.layer_norm(f + "layer_norm_a.", p + "layernorm_a.", c_a)
        if self.has(p + "layernorm_kv.layernorm_s.weight"):
            self.ada_ln(f + "ada_ln_kv.", p + "layernorm_kv.")
        self.layer_norm(f + "layer_norm_z.", p + "layernorm_z.", c_z)
        self.put(f + "linear_z.weight", self.take(p + "linear_nobias_z.weight"))
        self.mha(f + "mha.", p + "attention.")

    def conditioned_transition(self, f: str, p: str) -> None:
        self.ada_ln(f + "ada_ln.", p + "adaln.")
        self.stacked(f + "linear_ab.weight", p + "linear_nobias_a1.weight",
                     p + "linear_nobias_a2.weight")
        self.put(f + "linear_out.weight", self.take(p + "linear_nobias_b.weight"))
        self.linear(f + "linear_s_gate.", p + "linear_s.")


def _pairformer_stack(m: _Mapper, f: str, p: str, cfg: AlphaFold3Config, n: int) -> None:
    for i in range(n):
        fb, pb = f"{f}blocks.{i}.", f"{p}blocks.{i}."
        m.pair_updates(fb, pb, cfg.c_z)
        m.attention_pair_bias(fb + "single_attention.", pb + "attention_pair_bias.", cfg.c_s,
                              cfg.c_z)
        m.swiglu(fb + "single_transition.", pb + "single_transition.", cfg.c_s)


def _msa_module(m: _Mapper, f: str, p: str, cfg: AlphaFold3Config) -> None:
    m.put(f + "linear_m.weight", m.take(p + "linear_no_bias_m.weight"))
    m.put(f + "linear_s.weight", m.take(p + "linear_no_bias_s.weight"))
    c_m = cfg.msa.c_m
    for i in range(cfg.msa.no_blocks):
        fb, pb = f"{f}blocks.{i}.", f"{p}blocks.{i}."
        opm, popm = fb + "outer_product_mean.", pb + "outer_product_mean_msa."
        m.layer_norm(opm + "layer_norm.", popm + "layer_norm.", c_m)
        for name in ("1", "2", "out"):
            m.linear(f"{opm}linear_{name}.", f"{popm}linear_{name}.")
        if i < cfg.msa.no_blocks - 1:
            fw, pw = fb + "pair_weighted_averaging.", pb + "msa_stack.msa_pair_weighted_averaging."
            m.layer_norm(fw + "layer_norm_m.", pw + "layernorm_m.", c_m)
            m.layer_norm(fw + "layer_norm_z.", pw + "layernorm_z.", cfg.c_z)
            for fn, pn in (("v", "mv"), ("b", "z"), ("g", "mg"), ("o", "out")):
                m.put(f"{fw}linear_{fn}.weight", m.take(f"{pw}linear_no_bias_{pn}.weight"))
            m.swiglu(fb + "msa_transition.", pb + "msa_stack.transition_m.", c_m)
        m.pair_updates(fb, pb + "pair_stack.", cfg.c_z)


def _atom_transformer(m: _Mapper, f: str, p: str, cfg: AlphaFold3Config) -> None:
    a = cfg.atom
    for i in range(a.no_blocks):
        pb = f"{p}atom_transformer.diffusion_transformer.blocks.{i}."
        m.attention_pair_bias(f"{f}transformer.attention.{i}.", pb + "attention_pair_bias.",
                              a.c_atom, a.c_atompair)
        m.conditioned_transition(f"{f}transformer.transition.{i}.",
                                 pb + "conditioned_transition_block.")


def _atom_encoder(m: _Mapper, f: str, p: str, cfg: AlphaFold3Config, trunk: bool) -> None:
    # fold's linear_feat reads [ref_pos (3), arcsinh(charge) (1), ref_mask, element, name chars]
    m.put(f + "linear_feat.weight", torch.cat([
        m.take(p + "linear_no_bias_ref_pos.weight"), m.take(p + "linear_no_bias_ref_charge.weight"),
        m.take(p + "linear_no_bias_f.weight")], dim=1))
    for fn, pn in (("d", "d"), ("inv_d", "invd"), ("v", "v"), ("c_q", "cl"), ("c_k", "cm"),
                   ("out", "q")):
        m.put(f"{f}linear_{fn}.weight", m.take(f"{p}linear_no_bias_{pn}.weight"))
    for k in (1, 3, 5):
        m.put(f"{f}pair_mlp.{k}.weight", m.take(f"{p}small_mlp.{k}.weight"))
    if trunk:
        m.layer_norm(f + "layer_norm_s.", p + "layernorm_s.", cfg.c_s)
        m.layer_norm(f + "layer_norm_z.", p + "layernorm_z.", cfg.c_z)
        for name in ("s", "z", "r"):
            m.put(f"{f}linear_{name}.weight", m.take(f"{p}linear_no_bias_{name}.weight"))
    _atom_transformer(m, f, p, cfg)


def _diffusion(m: _Mapper, f: str, p: str, cfg: AlphaFold3Config) -> None:
    c_z, c_s, c_token = cfg.c_z, cfg.c_s, cfg.diffusion.c_token
    fc, pc = f + "conditioning.", p + "diffusion_conditioning."
    m.put(fc + "relpos.linear.weight", m.take(pc + "relpe.linear_no_bias.weight"))
    m.layer_norm(fc + "layer_norm_z.", pc + "layernorm_z.", 2 * c_z)
    m.put(fc + "linear_z.weight", m.take(pc + "linear_no_bias_z.weight"))
    m.layer_norm(fc + "layer_norm_s.", pc + "layernorm_s.", c_s + cfg.c_s_inputs)
    m.put(fc + "linear_s.weight", m.take(pc + "linear_no_bias_s.weight"))
    m.put(fc + "fourier.w", m.take(pc + "fourier_embedding.w"))
    m.put(fc + "fourier.b", m.take(pc + "fourier_embedding.b"))
    m.layer_norm(fc + "layer_norm_n.", pc + "layernorm_n.", cfg.diffusion.c_fourier)
    m.put(fc + "linear_n.weight", m.take(pc + "linear_no_bias_n.weight"))
    for k in (0, 1):
        m.swiglu(f"{fc}transitions_z.{k}.", f"{pc}transition_z{k + 1}.", c_z)
        m.swiglu(f"{fc}transitions_s.{k}.", f"{pc}transition_s{k + 1}.", c_s)
    _atom_encoder(m, f + "encoder.", p + "atom_attention_encoder.", cfg, trunk=True)
    m.layer_norm(f + "layer_norm_s.", p + "layernorm_s.", c_s)
    m.put(f + "linear_s.weight", m.take(p + "linear_no_bias_s.weight"))
    for i in range(cfg.diffusion.no_blocks):
        fb, pb = f"{f}transformer.blocks.{i}.", f"{p}diffusion_transformer.blocks.{i}."
        m.attention_pair_bias(fb + "attention.", pb + "attention_pair_bias.", c_token, c_z)
        m.conditioned_transition(fb + "transition.", pb + "conditioned_transition_block.")
    m.layer_norm(f + "layer_norm_a.", p + "layernorm_a.", c_token)
    fd, pd = f + "decoder.", p + "atom_attention_decoder."
    m.put(fd + "linear_a.weight", m.take(pd + "linear_no_bias_a.weight"))
    m.layer_norm(fd + "layer_norm.", pd + "layernorm_q.", cfg.atom.c_atom)
    m.put(fd + "linear_out.weight", m.take(pd + "linear_no_bias_out.weight"))
    _atom_transformer(m, fd, pd, cfg)


def _confidence(m: _Mapper, f: str, p: str, cfg: AlphaFold3Config) -> None:
    m.used.update({p + "lower_bins", p + "upper_bins"})  # the bins: in the config
    # Protenix: s1(s_inputs)[..., None, :, :] varies along j, s2(...)[..., None, :] along i
    for fn, pn in (("s_i", "s2"), ("s_j", "s1"), ("d", "d"), ("d_raw", "d_wo_onehot"),
                   ("pae", "pae"), ("pde", "pde")):
        m.put(f"{f}linear_{fn}.weight", m.take(f"{p}linear_no_bias_{pn}.weight"))
    for fn, pn, width in (("s_trunk", "input_strunk_ln", cfg.c_s), ("pae", "pae_ln", cfg.c_z),
                          ("pde", "pde_ln", cfg.c_z), ("plddt", "plddt_ln", cfg.c_s),
                          ("resolved", "resolved_ln", cfg.c_s)):
        m.layer_norm(f"{f}layer_norm_{fn}.", f"{p}{pn}.", width)
    m.put(f + "plddt_weight", m.take(p + "plddt_weight"))
    m.put(f + "resolved_weight", m.take(p + "resolved_weight"))
    _pairformer_stack(m, f + "pairformer.", p + "pairformer_stack.", cfg, cfg.confidence.no_blocks)


def _template(m: _Mapper, f: str, p: str, cfg: AlphaFold3Config) -> None:
    t = cfg.template
    m.layer_norm(f + "layer_norm_z.", p + "layernorm_z.", cfg.c_z)
    m.put(f + "linear_z.weight", m.take(p + "linear_no_bias_z.weight"))
    w = m.take(p + "linear_no_bias_a.weight")  # [c_t, 108]
    nb = t.distogram_no_bins
    # Protenix: [distogram, pb mask, restype_j, restype_i, unit vector, backbone mask];
    # fold:     [distogram, pb mask, unit vector, backbone mask, restype_i, restype_j]
    rt_j, rt_i = w[:, nb + 1:nb + 33], w[:, nb + 33:nb + 65]
    m.put(f + "linear_a.weight", torch.cat([w[:, :nb + 1], w[:, nb + 65:nb + 69], rt_i, rt_j], 1))
    for i in range(t.no_blocks):
        m.pair_updates(f"{f}blocks.{i}.", f"{p}pairformer_stack.blocks.{i}.", t.c_t)
    m.layer_norm(f + "layer_norm_v.", p + "layernorm_v.", t.c_t)
    m.put(f + "linear_out.weight", m.take(p + "linear_no_bias_u.weight"))


def convert_protenix_state(state: Mapping[str, torch.Tensor], cfg: AlphaFold3Config,
                           path: str = "<state>") -> dict[str, torch.Tensor]:
    """Protenix's state dict in fold's names for ``AlphaFold3(cfg)`` (``cfg`` from
    :func:`protenix_config`). Every Protenix tensor is used (a leftover one, e.g. of its
    constraint or ESM embedders, is an error naming it) and every tensor of fold's model is
    filled (checked against the model's names and shapes)."""
    m = _Mapper(state)
    try:
        _atom_encoder(m, "input_embedder.encoder.", "input_embedder.atom_attention_encoder.", cfg,
                      trunk=False)
        for fn, pn in (("s_init", "sinit"), ("z_i", "zinit1"), ("z_j", "zinit2"),
                       ("token_bonds", "token_bond"), ("z_prev", "z_cycle"), ("s_prev", "s")):
            m.put(f"linear_{fn}.weight", m.take(f"linear_no_bias_{pn}.weight"))
        m.put("relpos.linear.weight", m.take("relative_position_encoding.linear_no_bias.weight"))
        m.layer_norm("layer_norm_z_prev.", "layernorm_z_cycle.", cfg.c_z)
        m.layer_norm("layer_norm_s_prev.", "layernorm_s.", cfg.c_s)
        if cfg.template.enabled:
            _template(m, "template_embedder.", "template_embedder.", cfg)
        else:  # a template embedder of 0 blocks: Protenix never calls it
            m.used.update(k for k in state if k.startswith("template_embedder."))
        _msa_module(m, "msa_module.", "msa_module.", cfg)
        _pairformer_stack(m, "pairformer.", "pairformer_stack.", cfg, cfg.pairformer.no_blocks)
        _diffusion(m, "diffusion.", "diffusion_module.", cfg)
        # Protenix: Linear(z) + Linear(z)^T = W (z + z^T) + 2 b; fold: Linear(z + z^T)
        m.put("distogram_head.weight", m.take("distogram_head.linear.weight"))
        m.put("distogram_head.bias", 2 * m.take("distogram_head.linear.bias"))
        if cfg.confidence.enabled:
            _confidence(m, "confidence_head.", "confidence_head.", cfg)
    except KeyError as e:
        raise ProtenixParamsError(f"{path}: no tensor {e.args[0]!r} (expected by the Protenix "
                                  f"2.0 layout)") from e
    left = sorted(set(state) - m.used)
    if left:
        raise ProtenixParamsError(f"{path}: {len(left)} Protenix tensor(s) fold's AF3 has no "
                                  f"place for, e.g. {left[:5]} (constraint / ESM embedders are "
                                  f"not supported)")
    from fold_model.af3.model import AlphaFold3

    with torch.device("meta"):  # names and shapes only, no memory
        model_state = AlphaFold3(cfg).state_dict()
    # neutral values offered for parameters fold's module does not have (e.g. the biases of k
    # and v, which no attention of fold's has either) are dropped
    out = {k: v for k, v in m.out.items() if k in model_state or k not in m.filled}
    check_against(out, model_state, path)
    return out


# One module of fold's AF3 from the state dict of the same Protenix module (parity tests,
# partial imports): name -> mapping of the module's own (unprefixed) tensors.
_MODULES = {
    "pairformer": lambda m, cfg: _pairformer_stack(m, "", "", cfg, cfg.pairformer.no_blocks),
    "msa_module": lambda m, cfg: _msa_module(m, "", "", cfg),
    "template_embedder": lambda m, cfg: _template(m, "", "", cfg),
    "diffusion": lambda m, cfg: _diffusion(m, "", "", cfg),
    "confidence_head": lambda m, cfg: _confidence(m, "", "", cfg),
}


def convert_protenix_module(kind: str, state: Mapping[str, torch.Tensor], cfg: AlphaFold3Config,
                            module_state: Mapping[str, torch.Tensor]
                            ) -> tuple[dict[str, torch.Tensor], set[str]]:
    """The state dict of one Protenix module (``kind``: ``pairformer`` (its PairformerStack),
    ``msa_module``, ``template_embedder``, ``diffusion`` (DiffusionModule), ``confidence_head``)
    in the names of fold's module whose state dict is ``module_state``; and the fold names given
    a neutral value because Protenix has no such tensor (their gradients have no Protenix
    counterpart)."""
    if kind not in _MODULES:
        raise ValueError(f"unknown module {kind!r}; one of {sorted(_MODULES)}")
    m = _Mapper(state)
    _MODULES[kind](m, cfg)
    left = sorted(set(state) - m.used)
    if left:
        raise ProtenixParamsError(f"{kind}: Protenix tensors not mapped: {left[:5]}")
    out = {k: v for k, v in m.out.items() if k in module_state or k not in m.filled}
    check_against(out, module_state, kind)
    return out, m.filled & set(out)


def check_against(out: Mapping[str, torch.Tensor], model_state: Mapping[str, torch.Tensor],
                  path: str = "<state>") -> None:
    """``out`` has exactly the names and shapes of ``model_state`` (a fold model's)."""
    missing = sorted(set(model_state) - set(out))
    extra = sorted(set(out) - set(model_state))
    shapes = sorted(k for k in set(out) & set(model_state) if out[k].shape != model_state[k].shape)
    if missing or extra or shapes:
        raise ProtenixParamsError(
            f"{path}: mapped tensors do not fit fold's AF3: missing {missing[:5]}, "
            f"extra {extra[:5]}, shapes {[(k, tuple(out[k].shape)) for k in shapes[:5]]}")


def load_protenix_checkpoint(path: str | os.PathLike
                             ) -> tuple[AlphaFold3Config, dict[str, torch.Tensor]]:
    """``(config, state dict)`` of fold's AF3 for a Protenix checkpoint: ``AlphaFold3(config)``
    loads the state dict with ``strict=True``."""
    path = os.fspath(path)
    state = read_protenix_checkpoint(path)
    cfg = protenix_config(state, path)
    return cfg, convert_protenix_state(state, cfg, path)
