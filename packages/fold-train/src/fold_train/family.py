"""The model family of a training run: what differs between training AF2 and AF3 in one loop.

:class:`fold_train.loop.Trainer` is one loop (flat parameters, flat Adam + EMA, bf16 autocast,
seeded recycling draws, non-finite step skipping, checkpoints, metrics); a family supplies the
rest:

* ``build_model(model_config)`` and ``make_loss(model, model_config)``;
* ``to_bf16_weights(model)``: the modules whose weights may be bf16 (``bf16_weights=true``) cast;
* ``n_cycle_max(batch)``: the largest number of trunk passes a step may draw (``N_cycle`` is
  drawn uniformly from ``1..n_cycle_max`` by the loop, seeded by ``(seed, step)``);
* ``forward_loss(model, loss_fn, batch, n_cycle)``: ``(loss, {term: tensor}, aux)``, every loss
  term logged separately; ``aux`` holds detached tensors for the step metrics;
* ``step_metrics(batch, n_cycle, aux)``: extra floats of the step's metrics record;
* ``evaluate(model, samples, device, precision)``: ``{"eval/...": float}`` of the EMA weights on
  the held-out samples.

AF2 (supplement 1.11): batches ``{name: [B, R, ...]}`` with the recycling dimension, the AF2 loss
on the last pass's ground truth, lDDT-Ca of the step and structure metrics on evaluation.

AF3 (supplement 3-4, Alg. 1): batches ``{name: [B, ...]}``, ``N_cycle`` from ``1..no_cycles``
(section 3.4), the model's own loss (diffusion on ``no_samples`` noised copies, distogram,
confidence on the mini-rollout) with its parts; evaluation is the loss of the held-out samples on
fixed noise draws (the diffusion loss needs no sampling, so it is a cheap, deterministic score).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["AF2Family", "AF3Family", "model_family"]


def _last_pass(batch: dict[str, torch.Tensor], n_cycle: int) -> dict[str, torch.Tensor]:
    """Ground truth and features of pass ``n_cycle`` (``[B, R, ...]`` -> ``[B, ...]``)."""
    return {k: v[:, n_cycle - 1] for k, v in batch.items()}


class AF2Family:
    """AlphaFold2: ``fold_model.af2.AlphaFold2`` and ``AlphaFold2Loss``."""

    name = "af2"
    seeded_noise = False  # no diffusion noise: the loop passes no generator

    def build_model(self, model_config) -> torch.nn.Module:
        from fold_model.af2 import AlphaFold2

        return AlphaFold2(model_config)

    def to_bf16_weights(self, model) -> None:
        """Embedders and the Evoformer / extra MSA / template stacks in bf16; the structure
        module and the heads stay fp32 (fold-model runs the structure module in fp32 and feeds
        its fp32 single to the pLDDT head)."""
        model.to(torch.bfloat16)
        model.structure_module.float()
        model.aux_heads.float()

    def make_loss(self, model, model_config):
        from fold_model.af2.loss import AlphaFold2Loss

        return AlphaFold2Loss(model_config.loss)

    def n_cycle_max(self, batch: dict[str, torch.Tensor]) -> int:
        return int(batch["aatype"].shape[1])  # R recycling feature sets

    def forward_loss(self, model, loss_fn, batch, n_cycle: int):
        out = model(batch, num_recycles=n_cycle)
        loss, terms = loss_fn(out, _last_pass(batch, n_cycle))
        return loss, terms, {"final_atom_positions": out["final_atom_positions"].detach()}

    def step_metrics(self, batch, n_cycle: int, aux: dict[str, torch.Tensor]) -> dict[str, float]:
        from fold_model.af2.metrics import lddt_ca

        last = _last_pass(batch, n_cycle)
        with torch.no_grad():
            lddt = lddt_ca(aux["final_atom_positions"].float(),
                           last["all_atom_positions"].float(),
                           last["all_atom_mask"].float() * last["seq_mask"][..., None],
                           per_residue=False)
        return {"lddt_ca": float(lddt.mean())}

    def evaluate(self, model, samples, device, precision: str) -> dict[str, float]:
        from fold_train.loop import evaluate_model

        return evaluate_model(model, samples, device, precision=precision)


class _AF3Loss(torch.nn.Module):
    """``AlphaFold3.loss`` as a module (so a run can wrap or replace it like AF2's loss)."""

    def __init__(self, model) -> None:
        super().__init__()
        self._model = [model]  # not a submodule: its parameters belong to the model

    def forward(self, out, batch, pairs=None):
        return self._model[0].loss(out, batch, pairs)


class AF3Family:
    """AlphaFold3: ``fold_model.af3.AlphaFold3`` and its loss (``AlphaFold3.loss``)."""

    name = "af3"
    seeded_noise = True  # forward_loss takes the step's noise generator (loop.noise_seed)
    eval_noise_seeds = (0, 1, 2, 3)  # the fixed noise draws of the evaluation loss

    def __init__(self, model_config) -> None:
        self.model_config = model_config

    def build_model(self, model_config) -> torch.nn.Module:
        from fold_model.af3 import AlphaFold3

        return AlphaFold3(model_config)

    def to_bf16_weights(self, model) -> None:
        """The Pairformer, MSA module, template embedder and diffusion transformer in bf16; the
        embedders, conditioning, atom encoder/decoder and heads keep fp32 weights, so the
        single/pair streams and every coordinate stay fp32."""
        for stack in (model.pairformer, model.msa_module, model.template_embedder,
                      model.diffusion.transformer):
            if stack is not None:
                stack.to(torch.bfloat16)

    def make_loss(self, model, model_config):
        return _AF3Loss(model)

    def n_cycle_max(self, batch: dict[str, torch.Tensor]) -> int:
        return int(self.model_config.no_cycles)

    def loss_inputs(self, batch: dict[str, torch.Tensor]):
        """The loss's atom-pair lists (``fold_model.af3.loss.LossPairs``): functions of the
        ground truth, built before a captured step (their length depends on the data)."""
        from fold_model.af3.loss import loss_pair_lists

        return loss_pair_lists(batch, self.model_config.loss)

    def forward_loss(self, model, loss_fn, batch, n_cycle: int, generator=None, pairs=None):
        out = model(batch, no_cycles=n_cycle, generator=generator)
        loss, parts = loss_fn(out, batch, pairs)
        terms = {k: v for k, v in parts.items() if k != "loss"}
        terms["loss"] = loss
        return loss, terms, {}

    def step_metrics(self, batch, n_cycle: int, aux) -> dict[str, float]:
        return {"n_token": float(batch["token_mask"].sum(-1).float().mean()),
                "n_atom": float(batch["atom_mask"].sum(-1).float().mean())}

    @torch.no_grad()
    def fixed_noise_loss(self, model, batch, *, n_cycle: int | None = None,
                         seeds: Sequence[int] | None = None) -> dict[str, float]:
        """The training loss (and its parts) of ``batch`` averaged over fixed noise draws: the
        model in training mode (so it returns the denoised copies), every random draw from a
        generator seeded by ``seed`` and the global RNG (dropout) forked and seeded too, so two
        calls with the same weights give the same number."""
        seeds = tuple(seeds or self.eval_noise_seeds)
        was_training = model.training
        model.train()
        total: dict[str, float] = {}
        devices = [batch["token_mask"].device] if batch["token_mask"].is_cuda else []
        try:
            for seed in seeds:
                with torch.random.fork_rng(devices=devices):
                    torch.manual_seed(seed)
                    gen = torch.Generator(batch["token_mask"].device).manual_seed(seed)
                    out = model(batch, no_cycles=n_cycle or self.model_config.no_cycles,
                                generator=gen)
                    loss, parts = model.loss(out, batch)
                for k, v in {**parts, "loss": loss}.items():
                    total[k] = total.get(k, 0.0) + float(v) / len(seeds)
        finally:
            model.train(was_training)
        return total

    def evaluate(self, model, samples, device, precision: str) -> dict[str, float]:
        from fold_train.data import collate
        from fold_train.loop import _autocast

        per: dict[str, list[float]] = {}
        result: dict[str, float] = {}
        for name, sample in samples:
            batch = {k: v.to(device) for k, v in collate([sample]).items()}
            with _autocast(torch.device(device), precision):
                scores = self.fixed_noise_loss(model, batch)
            for k, v in scores.items():
                per.setdefault(k, []).append(v)
                result[f"eval/{name}/{k}"] = v
        result.update({f"eval/{k}": float(np.mean(v)) for k, v in per.items()})
        return result


def model_family(name: str, model_config: Any):
    """The :class:`AF2Family` or :class:`AF3Family` of a run."""
    if name == "af2":
        return AF2Family()
    if name == "af3":
        return AF3Family(model_config)
    raise ValueError(f"unknown model family {name!r}; expected 'af2' or 'af3'")
