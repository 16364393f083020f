"""The kernels serve the models as fold-train runs them: bf16 autocast over fp32 weights and fp32
single / pair / MSA streams (every ``fold-train predict``; ``fold-train train`` with
``precision=bf16``).

Until 2026-11-30 fold-kernels refused every fp32 input under autocast, so the pair stack's
LayerNorms and the projections they feed ran on the PyTorch path in the product while every
block benchmark, in bf16 throughout, used the kernels (issue 21: the AF3 trunk pass of a
768-token prediction took 954 ms, 447 ms once served). This runs whole tiny models under
autocast with the torch backend and asks fold-kernels' ``supports`` predicate about every op
call as the registry would (lowered inputs included), as if the tensors were on a GPU: it may
refuse a call for its shapes (those listed below), never for its dtypes (a refused call that
the kernel takes with every input in bf16).
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parents[2] / "packages" / "fold-model" / "tests"
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "af3"))

fold_kernels = pytest.importorskip("fold_kernels")

# (op, why the kernel refuses it): shapes the kernels do not cover, whatever the precision
SHAPE_REFUSALS = {
    # with autograd (training): AF3's sequence-local atom attention (32 queries, 128 keys a
    # window) and AF2's template pointwise attention (one query, N_templ keys), N_q != N_k,
    # whose kernel is a forward for inference (fold_kernels.evo_attention_cross)
    "attention": "queries and keys of different lengths, under autograd",
}


def _bf16(a):
    return a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point() else a


def _refusals(monkeypatch, run, grad: bool = False
              ) -> tuple[collections.Counter, collections.Counter]:
    """``run()`` under bf16 autocast on the CPU with the torch backend (autograd on with
    ``grad``: the training forward's ops, e.g. ``layer_norm_pair_bias``), fold-kernels' predicate
    asked about every op call as the registry asks it (lowered inputs included), as if on a
    GPU: ``(by_dtype, by_shape)``, the refused calls by ``(op, input dtypes)``, split by
    whether the kernel would take the same call with every floating input in bf16 (a dtype
    refusal) or not (a shape refusal)."""
    from fold_kernels import registration
    from fold_model import ops
    from fold_model.ops import registry
    from fold_ops.autocast import lower

    monkeypatch.setattr(registration, "_on_gpu", lambda *tensors: True)
    by_dtype: collections.Counter = collections.Counter()
    by_shape: collections.Counter = collections.Counter()
    calls = [0]
    select = registry._select

    def spy(op, args, kwargs, backend, fake):
        if op in registration.SUPPORTS:
            calls[0] += 1
            supports = registration.SUPPORTS[op][1]
            a, k = lower(args, kwargs) if op in registry._LOWERED else (args, kwargs)
            if not supports(*a, **k):
                dtypes = tuple(str(t.dtype).removeprefix("torch.") for t in (*a, *k.values())
                               if isinstance(t, torch.Tensor))
                with torch.autocast("cpu", enabled=False):
                    same = supports(*map(_bf16, a), **{n: _bf16(v) for n, v in k.items()})
                (by_dtype if same else by_shape)[(op, dtypes)] += 1
        return select(op, args, kwargs, backend, fake)

    monkeypatch.setattr(registry, "_select", spy)
    with ops.use_backend("torch"), torch.set_grad_enabled(grad), \
            torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        run()
    assert calls[0] > 100  # the model went through the registry
    return by_dtype, by_shape


def _check(by_dtype: collections.Counter, by_shape: collections.Counter,
           training: bool = False) -> None:
    """No refusal for a dtype; for a shape only those of :data:`SHAPE_REFUSALS` (training)."""
    assert not by_dtype, f"refused for their dtypes under autocast: {dict(by_dtype)}"
    known = SHAPE_REFUSALS if training else {}
    new = {k: n for k, n in by_shape.items() if k[0] not in known}
    assert not new, f"refused shapes not known here: {new}"


@pytest.mark.parametrize("mode", ["predict", "train", "train, bf16 trunk weights"])
def test_af3_uses_the_kernels(monkeypatch, mode):
    """Prediction: the trunk (template, MSA module, Pairformer), the distogram and two sampler
    steps of the diffusion module (atom encoder / decoder, diffusion transformer). Training:
    the forward with autograd and dropout (the trunk and the diffusion module's training
    samples), fp32 weights or, as ``system.bf16_weights`` leaves them (fold-train's AF3
    family), bf16 trunk stacks beside fp32 embedders."""
    from _af3_helpers import random_features
    from fold_model.af3 import AlphaFold3
    from fold_model.af3.config import config

    model = AlphaFold3(config("tiny"))
    feats = random_features()
    if mode == "predict":
        model.eval()

        def run():
            out = model(feats)
            model.sample(feats, out["s_inputs"], out["single"], out["pair"], no_samples=2,
                         no_steps=2)
    else:
        if mode.endswith("bf16 trunk weights"):
            from fold_train.families import make_family

            make_family("af3").to_bf16_weights(model)
        model.train()

        def run():
            model(feats, generator=torch.Generator().manual_seed(0))

    _check(*_refusals(monkeypatch, run, grad=mode != "predict"), training=mode != "predict")


def test_af2_prediction_uses_the_kernels(monkeypatch):
    from _trunk_helpers import make_batch
    from fold_model.af2 import AlphaFold2, config

    model = AlphaFold2(config("tiny")).eval()
    batch = make_batch()
    _check(*_refusals(monkeypatch, lambda: model(batch)))
