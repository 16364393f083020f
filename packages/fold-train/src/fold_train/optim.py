"""Tensor fusion (HelixFold 3.2) and the AF2 optimizer: Adam + warm-up/decay schedule, global-norm
clipping and an EMA of the weights, over a few flat buffers.

:class:`FlatParams` packs a module's parameters into one contiguous fp32 buffer per
``(device, dtype)`` group and makes every parameter (and its ``.grad``) a view into it. Autograd
then accumulates every gradient straight into one flat gradient buffer, so the gradient
all-reduce, the global norm, the clipping and the whole Adam + EMA update are a handful of
operations on a few long vectors instead of thousands of small per-tensor ones.

:class:`FlatAdam` holds the Adam moments and the EMA as flat buffers of the same layout (and, for
bf16 parameters, an fp32 master copy that Adam updates and the parameters are rounded from). On CUDA
it calls ``fold_kernels.optim.fused_adam_ema_`` (one launch per group: Adam, clipping factor and
EMA together) and ``global_grad_norm``; elsewhere (CPU) the same arithmetic runs as a few PyTorch
ops on the flat buffers. Both match ``torch.optim.Adam`` + ``clip_grad_norm_`` + a manual EMA.

The schedule is AF2's (supplement 1.11.3): Adam (beta1 0.9, beta2 0.999, eps 1e-6), learning
rate 1e-3 linearly warmed up over the first 1000 steps, then multiplied by 0.95 every 50 000
steps; gradients clipped to global norm 0.1; an exponential moving average of the weights with
decay 0.999 (used for evaluation and prediction), or, with ``averaging="swa"``, the running mean
of the weights (ScaleFold's FusedAdam+SWA).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

__all__ = ["AdamConfig", "FlatAdam", "FlatGroup", "FlatParams", "learning_rate"]


@dataclass
class FlatGroup:
    """Parameters of one ``(device, dtype)``: ``param`` and ``grad`` are flat ``[n]`` buffers and
    parameter ``names[i]`` is ``param[offsets[i] : offsets[i] + numels[i]]`` in its own shape."""

    names: list[str]
    shapes: list[torch.Size]
    offsets: list[int]
    param: torch.Tensor  # [n]
    grad: torch.Tensor  # [n]

    @property
    def numel(self) -> int:
        return self.param.numel()


class FlatParams:
    """Make ``module``'s trainable parameters and their gradients views of flat buffers.

    Parameters are grouped by ``(device, dtype)``; each group gets one contiguous parameter buffer
    and one gradient buffer. Gradients accumulate in place into the gradient buffer (each
    ``p.grad`` is a view of it), so :meth:`zero_grad` zeroes buffers rather than freeing grads.
    Moving the module to another device or dtype afterwards breaks the views (checked by
    :meth:`check`); build FlatParams after ``module.to(...)``.

    Every parameter starts at a multiple of ``align_bytes`` from the buffer's start (the gaps
    stay zero in the gradient, so norms and updates are unchanged): a parameter view is then as
    aligned as a separately allocated tensor (the CUDA caching allocator rounds blocks to 512
    bytes), so vectorized elementwise kernels, Triton's 16-byte pointer specialization and
    cuBLAS/TMA GEMMs on the weights (bf16 parameters are used without a cast) get aligned
    pointers. ``align_bytes=1``: the parameters packed densely.
    """

    def __init__(self, module: nn.Module, *, align_bytes: int = 512) -> None:
        if align_bytes < 1:
            raise ValueError(f"align_bytes must be >= 1, got {align_bytes}")
        self.module = module
        buckets: dict[tuple[torch.device, torch.dtype], list[tuple[str, nn.Parameter]]] = {}
        for name, p in module.named_parameters():
            if p.requires_grad:
                buckets.setdefault((p.device, p.dtype), []).append((name, p))
        if not buckets:
            raise ValueError(f"{type(module).__name__} has no trainable parameters")
        self.groups: list[FlatGroup] = []
        self._params: list[list[nn.Parameter]] = []
        for (device, dtype), items in buckets.items():
            align = max(1, align_bytes // torch.empty((), dtype=dtype).element_size())
            offsets = _aligned_offsets([p.numel() for _, p in items], align)
            total = offsets[-1] + items[-1][1].numel()
            # zeros: the alignment gaps are never written (zero gradient, zero update)
            flat = torch.zeros(total, device=device, dtype=dtype)
            grad = torch.zeros(total, device=device, dtype=dtype)
            with torch.no_grad():
                for (_, p), off in zip(items, offsets):
                    n = p.numel()
                    flat[off:off + n].copy_(p.reshape(-1))
                    # The parameter now lives in the flat buffer; p.grad is a view of the flat
                    # gradient, into which autograd accumulates in place.
                    p.data = flat[off:off + n].view_as(p)
                    p.grad = grad[off:off + n].view_as(p)
            self.groups.append(FlatGroup([n for n, _ in items], [p.shape for _, p in items],
                                         offsets, flat, grad))
            self._params.append([p for _, p in items])

    @property
    def numel(self) -> int:
        return sum(g.numel for g in self.groups)

    def tensors(self) -> list[torch.Tensor]:
        """The weights as tensors: the groups' flat buffers."""
        return [g.param for g in self.groups]

    def zero_grad(self) -> None:
        for g in self.groups:
            g.grad.zero_()

    def check(self) -> None:
        """Raise if a parameter or its gradient no longer aliases the flat buffers (the module was
        moved, a parameter replaced, or a grad set to None / reassigned)."""
        for g, params in zip(self.groups, self._params):
            for name, off, p in zip(g.names, g.offsets, params):
                if p.data_ptr() != g.param[off:].data_ptr():
                    raise RuntimeError(f"parameter {name!r} no longer lives in the flat buffer "
                                       "(moved or replaced after FlatParams was built)")
                if p.grad is None or p.grad.data_ptr() != g.grad[off:].data_ptr():
                    raise RuntimeError(f"gradient of {name!r} no longer lives in the flat "
                                       "gradient buffer (set to None or reassigned)")

    def views(self, buffers: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """``{name: view}`` of per-group flat ``buffers`` laid out like the parameters."""
        out = {}
        for g, buf in zip(self.groups, buffers):
            for name, shape, off in zip(g.names, g.shapes, g.offsets):
                out[name] = buf[off:off + math.prod(shape)].view(shape)
        return out

    def layout(self) -> list[list[tuple[str, list[int]]]]:
        """Names and shapes per group: what a checkpoint of flat buffers must match."""
        return [[(n, list(s)) for n, s in zip(g.names, g.shapes)] for g in self.groups]

    def offsets(self) -> list[list[int]]:
        """Each parameter's start in its group's flat buffer (saved beside the buffers)."""
        return [list(g.offsets) for g in self.groups]

    def load_buffers(self, dst: list[torch.Tensor], src: list[torch.Tensor],
                     src_offsets: list[list[int]] | None = None) -> None:
        """Copy flat buffers ``src`` (one per group, parameters at ``src_offsets``; None: packed
        densely, as checkpoints written before the alignment) into ``dst`` laid out like this
        FlatParams. The layouts' names and shapes must already match (:meth:`layout`)."""
        if len(src) != len(self.groups) or len(dst) != len(self.groups):
            raise ValueError(f"expected {len(self.groups)} flat buffers, got {len(src)}")
        for i, (d, s) in enumerate(zip(dst, src)):
            self.load_group(i, d, s, None if src_offsets is None else src_offsets[i])

    def load_saved(self, dst: list[torch.Tensor], src: list[torch.Tensor],
                   src_layout: list[list[tuple[str, list[int]]]],
                   src_offsets: list[list[int]] | None = None) -> None:
        """Flat buffers ``src`` saved with ``src_layout`` (names and shapes per group) into
        ``dst``: :meth:`load_buffers` when that is this model's layout, else
        :meth:`load_renamed`."""
        layout = [[(n, list(s)) for n, s in group] for group in src_layout]
        if layout == self.layout():
            self.load_buffers(dst, src, src_offsets)
        else:
            self.load_renamed(dst, src, layout, src_offsets)

    @torch.no_grad()
    def load_renamed(self, dst: list[torch.Tensor], src: list[torch.Tensor],
                     src_layout: list[list[tuple[str, list[int]]]],
                     src_offsets: list[list[int]] | None = None) -> None:
        """:meth:`load_buffers` for flat buffers saved under an earlier layout of this model's
        parameters (``src_layout``: names and shapes per group, as :meth:`layout` gave then):
        each saved parameter is taken by name, fold-model's conversions of its earlier layouts
        are applied (:func:`fold_model.upgrades.upgrade_state_dict`), and the result must name
        exactly this model's parameters with their shapes. Raises ``ValueError`` naming what
        differs."""
        from fold_model.upgrades import upgrade_state_dict

        if len(src) != len(src_layout):
            raise ValueError(f"{len(src)} flat buffers for a layout of {len(src_layout)} groups")
        named: dict[str, torch.Tensor] = {}
        for i, (group, buf) in enumerate(zip(src_layout, src)):
            sizes = [math.prod(shape) for _, shape in group]
            offs = (list(src_offsets[i]) if src_offsets is not None
                    else _aligned_offsets(sizes, 1))
            if len(offs) != len(group) or (group and buf.numel() < offs[-1] + sizes[-1]):
                raise ValueError(f"flat buffer {i} does not hold the {len(group)} parameters "
                                 "of its saved layout")
            for (name, shape), off, n in zip(group, offs, sizes):
                named[name] = buf[off:off + n].view(shape)
        named = dict(upgrade_state_dict(named))
        want = self.views(dst)
        missing, extra = sorted(set(want) - set(named)), sorted(set(named) - set(want))
        wrong = sorted(k for k in set(want) & set(named) if named[k].shape != want[k].shape)
        if missing or extra or wrong:
            raise ValueError(f"saved parameters do not match this model's: missing "
                             f"{missing[:5]}, unexpected {extra[:5]}, other shapes {wrong[:5]}"
                             f" ({len(missing)}, {len(extra)}, {len(wrong)} in all)")
        for name, view in want.items():
            view.copy_(named[name])

    @torch.no_grad()
    def load_group(self, i: int, dst: torch.Tensor, src: torch.Tensor,
                   src_offsets: list[int] | None = None) -> None:
        """:meth:`load_buffers` for group ``i`` alone."""
        g = self.groups[i]
        offs = (list(src_offsets) if src_offsets is not None
                else _aligned_offsets([math.prod(sh) for sh in g.shapes], 1))
        end = offs[-1] + math.prod(g.shapes[-1]) if offs else 0
        if len(offs) != len(g.offsets) or src.numel() < end:
            raise ValueError(f"flat buffer {i} holds {src.numel()} values at {len(offs)} "
                             f"offsets; its {len(g.offsets)} parameters need {end}")
        if offs == g.offsets and src.numel() == dst.numel():
            dst.copy_(src)
            return
        for shape, o_src, o_dst in zip(g.shapes, offs, g.offsets):
            n = math.prod(shape)
            dst[o_dst:o_dst + n].copy_(src[o_src:o_src + n])


def _aligned_offsets(numels: list[int], align: int) -> list[int]:
    """Starts of consecutive blocks of ``numels`` elements, each rounded up to ``align``."""
    offsets, off = [], 0
    for n in numels:
        off = -(-off // align) * align
        offsets.append(off)
        off += n
    return offsets


@dataclass
class AdamConfig:
    """AF2's optimizer (supplement 1.11.3)."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-6
    weight_decay: float = 0.0  # decoupled (AdamW); AF2 uses none
    warmup_steps: int = 1000
    decay_factor: float = 0.95
    decay_every: int = 50_000
    clip_norm: float | None = 0.1  # global gradient norm; None turns clipping off
    ema_decay: float | None = 0.999  # None turns the weight average off
    # "ema": exponential moving average with ema_decay; "swa": the equal-weight running mean of
    # the weights after every update (stochastic weight averaging, as ScaleFold's FusedAdam+SWA)
    averaging: Literal["ema", "swa"] = "ema"

    def __post_init__(self) -> None:
        # comparisons with NaN are false: every float must be checked for finiteness first
        for name, value in vars(self).items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if not (self.lr > 0 and self.eps > 0):
            raise ValueError(f"lr and eps must be > 0, got {self.lr}, {self.eps}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"betas must be in [0, 1), got {self.beta1}, {self.beta2}")
        if self.warmup_steps < 0 or self.decay_every < 1:
            raise ValueError("warmup_steps must be >= 0 and decay_every >= 1")
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise ValueError(f"clip_norm must be > 0 or None, got {self.clip_norm}")
        if self.ema_decay is not None and not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay must be in [0, 1) or None, got {self.ema_decay}")
        if self.averaging not in ("ema", "swa"):
            raise ValueError(f"averaging must be 'ema' or 'swa', got {self.averaging!r}")


def learning_rate(step: int, cfg: AdamConfig) -> float:
    """The learning rate of update ``step`` (counted from 1): linear warm-up to ``cfg.lr`` over
    ``warmup_steps``, then ``decay_factor ** (step // decay_every)``."""
    warm = min(1.0, step / cfg.warmup_steps) if cfg.warmup_steps > 0 else 1.0
    return cfg.lr * warm * cfg.decay_factor ** (step // cfg.decay_every)


@contextlib.contextmanager
def swapped_in(weights: list[torch.Tensor], values: list[torch.Tensor] | None) -> Iterator[None]:
    """``values`` copied into ``weights`` inside the block, the weights restored after it (the
    EMA swap of both optimizers); ``values=None``: the weights as they are."""
    if values is None:
        yield
        return
    with torch.no_grad():
        saved = [w.clone() for w in weights]
        for w, v in zip(weights, values):
            w.copy_(v)
    try:
        yield
    finally:
        with torch.no_grad():
            for w, v in zip(weights, saved):
                w.copy_(v)


def _fused_kernels():
    """``fold_kernels.optim`` when it can be imported (Triton present), else None."""
    try:
        from fold_kernels import optim
    except Exception:  # no triton / no fold-kernels: the PyTorch path is always there
        return None
    return optim


class FlatAdam:
    """Adam + global-norm clipping + EMA over the buffers of a :class:`FlatParams`.

    ``use_kernels``: None picks ``fold_kernels`` for CUDA buffers when importable; True requires
    it (error otherwise); False always uses the PyTorch path.

    Usage per training step::

        norm = opt.grad_norm()            # 0-dim fp32 tensor
        if torch.isfinite(norm): opt.step(norm)
        flat.zero_grad()
    """

    def __init__(self, flat: FlatParams, cfg: AdamConfig | None = None, *,
                 use_kernels: bool | None = None) -> None:
        self.flat = flat
        self.cfg = cfg or AdamConfig()
        self.step_count = 0
        self.exp_avg = [torch.zeros_like(g.param, dtype=torch.float32) for g in flat.groups]
        self.exp_avg_sq = [torch.zeros_like(g.param, dtype=torch.float32) for g in flat.groups]
        # fp32 master weights for low-precision (bf16) parameter groups: Adam updates the
        # master copy and the parameters receive its rounding (HelixFold / ScaleFold bf16).
        self.master: list[torch.Tensor | None] = [
            None if g.param.dtype == torch.float32 else g.param.detach().float().clone()
            for g in flat.groups]
        self.ema = ([self._weights(i).detach().clone().float()
                     for i in range(len(flat.groups))]
                    if self.cfg.ema_decay is not None else None)
        on_cuda = all(g.param.is_cuda for g in flat.groups)
        want = use_kernels or (use_kernels is None and on_cuda)
        kernels = _fused_kernels() if want else None
        if use_kernels and kernels is None:
            raise RuntimeError("use_kernels=True but fold_kernels.optim cannot be imported")
        interpreting = kernels is not None and kernels.tuning.interpreting()
        if use_kernels and not (on_cuda or interpreting):
            raise RuntimeError("use_kernels=True needs CUDA buffers (or TRITON_INTERPRET=1)")
        self._kernels = kernels if (use_kernels or (use_kernels is None and on_cuda)) else None

    def _weights(self, i: int) -> torch.Tensor:
        """The fp32 buffer Adam updates for group ``i``: the parameters, or their master."""
        master = self.master[i]
        return self.flat.groups[i].param if master is None else master

    @property
    def uses_kernels(self) -> bool:
        return self._kernels is not None

    @torch.no_grad()
    def grad_norm(self) -> torch.Tensor:
        """Global L2 norm of every gradient, a 0-dim fp32 tensor on the first group's device
        (no host synchronization)."""
        if self._kernels is not None:
            return self._kernels.global_grad_norm([g.grad for g in self.flat.groups])
        dev = self.flat.groups[0].grad.device
        sq = [g.grad.float().square().sum().to(dev) for g in self.flat.groups]
        return torch.stack(sq).sum().sqrt()

    def clip_coefficient(self, norm: torch.Tensor) -> torch.Tensor | None:
        """``min(1, clip_norm / (norm + 1e-6))`` as a 1-element tensor (as
        ``torch.nn.utils.clip_grad_norm_``), or None when clipping is off."""
        if self.cfg.clip_norm is None:
            return None
        return (self.cfg.clip_norm / (norm.float() + 1e-6)).clamp(max=1.0).reshape(1)

    @torch.no_grad()
    def step(self, norm: torch.Tensor | None = None) -> dict[str, float | torch.Tensor]:
        """One update: clip by the global norm (``norm`` from :meth:`grad_norm`, computed here if
        None), Adam, then the EMA. Returns ``{"lr", "grad_norm", "clip_coef"}`` (tensors stay on
        the device)."""
        cfg = self.cfg
        if norm is None:
            norm = self.grad_norm()
        coef = self.clip_coefficient(norm)
        self.step_count += 1
        lr = learning_rate(self.step_count, cfg)
        decay = self._average_decay()
        for i, g in enumerate(self.flat.groups):
            scale = None if coef is None else coef.to(g.grad.device)
            ema = None if self.ema is None else self.ema[i]
            weights = self._weights(i)
            if self._kernels is not None:
                self._kernels.fused_adam_ema_(
                    weights, g.grad, self.exp_avg[i], self.exp_avg_sq[i], ema,
                    step=self.step_count, lr=lr, beta1=cfg.beta1, beta2=cfg.beta2, eps=cfg.eps,
                    weight_decay=cfg.weight_decay, ema_decay=decay, grad_scale=scale,
                )
            else:
                self._torch_update(i, weights, g.grad, scale, ema, lr, decay)
            if weights is not g.param:
                g.param.copy_(weights)  # round the updated master into the bf16 parameters
        return {"lr": lr, "grad_norm": norm, "clip_coef": coef if coef is not None else 1.0}

    def _average_decay(self) -> float | None:
        """The weight-average decay of the current update: ``ema_decay``, or for SWA
        ``(n - 1) / n`` at update ``n`` (so the average is the mean of the weights after updates
        1..n)."""
        if self.cfg.ema_decay is None:
            return None
        if self.cfg.averaging == "swa":
            return (self.step_count - 1) / self.step_count
        return self.cfg.ema_decay

    def _torch_update(self, i: int, p: torch.Tensor, grad: torch.Tensor,
                      scale: torch.Tensor | None, ema: torch.Tensor | None, lr: float,
                      decay: float | None) -> None:
        """The PyTorch path: the same arithmetic as the fused kernel, on whole flat buffers
        (``p``: the fp32 weights updated in place, ``grad`` the group's flat gradient)."""
        cfg = self.cfg
        grad = grad.float()
        if scale is not None:
            grad = grad * scale
        m, v = self.exp_avg[i], self.exp_avg_sq[i]
        m.lerp_(grad, 1.0 - cfg.beta1)  # m = b1 m + (1 - b1) g
        v.mul_(cfg.beta2).addcmul_(grad, grad, value=1.0 - cfg.beta2)
        bc1 = 1.0 - cfg.beta1 ** self.step_count
        bc2 = 1.0 - cfg.beta2 ** self.step_count
        if cfg.weight_decay:
            p.mul_(1.0 - lr * cfg.weight_decay)
        denom = (v / bc2).sqrt_().add_(cfg.eps)
        p.addcdiv_(m, denom, value=-lr / bc1)
        if ema is not None and decay is not None:
            ema.lerp_(p.float(), 1.0 - decay)  # e = d e + (1 - d) p

    # -- EMA ----------------------------------------------------------------------------------
    def ema_state_dict(self) -> dict[str, torch.Tensor]:
        """The averaged weights as ``{parameter name: tensor}`` (views of the EMA buffers)."""
        if self.ema is None:
            raise RuntimeError("the EMA is off (ema_decay=None)")
        return self.flat.views(self.ema)

    def swap_ema(self) -> contextlib.AbstractContextManager[None]:
        """Run the module with the averaged weights inside the block (evaluation, prediction)."""
        return swapped_in(self.flat.tensors(), self.ema)

    # -- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Moments, EMA and step as plain tensors/ints (safe for ``weights_only`` loading)."""
        return {
            "step": self.step_count,
            "layout": self.flat.layout(),
            "offsets": self.flat.offsets(),
            "exp_avg": [t.detach().cpu().clone() for t in self.exp_avg],
            "exp_avg_sq": [t.detach().cpu().clone() for t in self.exp_avg_sq],
            "ema": None if self.ema is None else [t.detach().cpu().clone() for t in self.ema],
            "master": [None if t is None else t.detach().cpu().clone() for t in self.master],
        }

    def load_state_dict(self, state: dict) -> None:
        """Moments, EMA, master weights and step from :meth:`state_dict`. Buffers saved under an
        earlier layout of the model's parameters (fold-model's renames, e.g. AdaLN's stacked
        projection) are taken by name (:meth:`FlatParams.load_renamed`)."""
        layout = [[(n, list(s)) for n, s in group] for group in state["layout"]]
        # parameter starts in the saved buffers (absent: packed densely, before the alignment)
        offs = state.get("offsets")
        renamed = layout != self.flat.layout()

        def load(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
            if not renamed:
                self.flat.load_buffers(dst, src, offs)
                return
            try:
                self.flat.load_renamed(dst, src, layout, offs)
            except ValueError as e:
                raise ValueError(f"optimizer state was saved for different parameters: {e}") \
                    from e

        with torch.no_grad():
            load(self.exp_avg, state["exp_avg"])
            load(self.exp_avg_sq, state["exp_avg_sq"])
            if self.ema is not None:
                if state.get("ema") is None:
                    raise ValueError("checkpoint has no EMA weights but the EMA is on")
                load(self.ema, state["ema"])
            # the master weights; without them (fp32 run, older checkpoint) the parameters
            # already loaded into the model are the best available copy
            saved = state.get("master") or [None] * len(self.master)
            if renamed:  # by name, when every group on both sides has them (a bf16 run)
                if all(t is not None for t in (*saved, *self.master)) and saved:
                    load(self.master, saved)
                else:
                    for dst, g in zip(self.master, self.flat.groups):
                        if dst is not None:
                            dst.copy_(g.param)
            else:
                for i, (dst, src) in enumerate(zip(self.master, saved)):
                    if dst is None:
                        continue
                    if src is None:
                        dst.copy_(self.flat.groups[i].param)
                    else:
                        self.flat.load_group(i, dst, src, None if offs is None else offs[i])
        self.step_count = int(state["step"])
