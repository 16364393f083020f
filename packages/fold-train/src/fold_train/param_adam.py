"""The optimizer without tensor fusion (``tensor_fusion=false``): ``torch.optim.Adam`` (AdamW when
``weight_decay`` is set, as :class:`~fold_train.optim.FlatAdam` decays decoupled) over the
parameter list, ``clip_grad_norm_``-style clipping and an EMA loop over the parameters.

The same arithmetic as :class:`~fold_train.optim.FlatAdam` (same schedule, clipping and
averaging), one PyTorch kernel per parameter tensor instead of a few over flat buffers: the eager
baseline that the tensor-fusion and fused-Adam switches are measured against
(``benchmarks/train/ablation.py``, ``benchmarks/train/af3.py``). Single process, fp32 weights,
no CUDA graphs (their gradients must live at fixed addresses); :class:`~fold_train.loop.Trainer`
refuses the other combinations.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from fold_train.optim import AdamConfig, learning_rate, swapped_in

__all__ = ["ParamAdam", "ParamList"]


class ParamList:
    """A module's trainable parameters as a plain list (the stand-in for
    :class:`~fold_train.optim.FlatParams`: gradients are freed between steps, not zeroed)."""

    def __init__(self, module: nn.Module) -> None:
        self.names = [n for n, p in module.named_parameters() if p.requires_grad]
        self.params = [p for p in module.parameters() if p.requires_grad]

    def tensors(self) -> list[torch.Tensor]:
        """The weights as tensors (one per parameter)."""
        return self.params

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def check(self) -> None:
        """Nothing to check: there are no views to break."""


class ParamAdam:
    """Adam + global-norm clipping + EMA per parameter tensor (see the module docstring); the
    interface of :class:`~fold_train.optim.FlatAdam` that the training loop uses."""

    def __init__(self, params: ParamList, cfg: AdamConfig | None = None) -> None:
        self.params = params
        self.cfg = cfg = cfg or AdamConfig()
        dtypes = {p.dtype for p in params.params}
        if dtypes - {torch.float32, torch.float64}:
            raise ValueError(f"ParamAdam updates fp32 weights in place; got "
                             f"{sorted(map(str, dtypes))} (bf16 weights need FlatAdam's fp32 "
                             "masters: tensor_fusion=true)")
        kind = torch.optim.AdamW if cfg.weight_decay else torch.optim.Adam
        self.adam = kind(params.params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                         weight_decay=cfg.weight_decay)
        self.step_count = 0
        self.ema = ([p.detach().clone() for p in params.params]
                    if cfg.ema_decay is not None else None)

    @property
    def uses_kernels(self) -> bool:
        return False

    def _grads(self) -> list[torch.Tensor]:
        return [p.grad for p in self.params.params if p.grad is not None]

    @torch.no_grad()
    def grad_norm(self) -> torch.Tensor:
        """Global L2 norm of the gradients (0-dim fp32; no host synchronization)."""
        grads = self._grads()
        if not grads:
            return torch.zeros((), device=self.params.params[0].device)
        norms = torch._foreach_norm(grads)
        return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))

    @torch.no_grad()
    def step(self, norm: torch.Tensor | None = None) -> dict[str, float | torch.Tensor]:
        """Clip by ``norm`` (as ``clip_grad_norm_``: ``min(1, clip / (norm + 1e-6))``), Adam with
        the schedule's learning rate, then the EMA. Returns ``{"lr", "grad_norm", "clip_coef"}``."""
        cfg = self.cfg
        if norm is None:
            norm = self.grad_norm()
        coef = None
        if cfg.clip_norm is not None:
            coef = (cfg.clip_norm / (norm.float() + 1e-6)).clamp(max=1.0)
            torch._foreach_mul_(self._grads(), coef)
        self.step_count += 1
        lr = learning_rate(self.step_count, cfg)
        for group in self.adam.param_groups:
            group["lr"] = lr
        self.adam.step()
        if self.ema is not None:
            decay = ((self.step_count - 1) / self.step_count if cfg.averaging == "swa"
                     else cfg.ema_decay)
            for e, p in zip(self.ema, self.params.params):
                e.lerp_(p, 1.0 - decay)
        return {"lr": lr, "grad_norm": norm, "clip_coef": coef if coef is not None else 1.0}

    def swap_ema(self) -> contextlib.AbstractContextManager[None]:
        """Run the module with the averaged weights inside the block."""
        return swapped_in(self.params.tensors(), self.ema)

    def state_dict(self) -> dict:
        return {"format": "param_adam", "step": self.step_count, "names": self.params.names,
                "adam": self.adam.state_dict(),
                "ema": None if self.ema is None else [e.detach().cpu().clone() for e in self.ema]}

    def load_state_dict(self, state: dict) -> None:
        if state.get("format") != "param_adam":
            raise ValueError("optimizer state was saved with tensor_fusion=true (flat buffers); "
                             "this run has tensor_fusion=false")
        if state["names"] != self.params.names:
            raise ValueError("optimizer state was saved for different parameters")
        self.adam.load_state_dict(state["adam"])
        if self.ema is not None:
            if state.get("ema") is None:
                raise ValueError("checkpoint has no EMA weights but the EMA is on")
            with torch.no_grad():
                for e, s in zip(self.ema, state["ema"]):
                    e.copy_(s)
        self.step_count = int(state["step"])
