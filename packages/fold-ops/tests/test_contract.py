"""The op contract, the cached environment variable and the tracing checks."""

from __future__ import annotations

import inspect

import torch
import torch.fx
from fold_ops import OPS, EnvVar, compiling, fx_tracing, reference


def test_every_op_has_a_reference_and_fallbacks_share_its_signature():
    for name, op in OPS.items():
        assert op.name == name and callable(op.reference)
        assert op.signature == inspect.signature(op.reference)
        if op.falls_back_to is not None:
            assert op.signature == OPS[op.falls_back_to].signature, name
        else:
            assert getattr(reference, name) is op.reference, name
    assert OPS["triangle_attention"].falls_back_to == "attention_packed"


def test_env_var_is_reparsed_when_the_value_changes(monkeypatch):
    parsed = []

    def parse(text):
        parsed.append(text)
        return text

    var = EnvVar("FOLD_OPS_TEST_VARIABLE", parse)
    monkeypatch.delenv("FOLD_OPS_TEST_VARIABLE", raising=False)
    assert var.get() is None and var.get() is None
    monkeypatch.setenv("FOLD_OPS_TEST_VARIABLE", "a")
    assert var.get() == "a" and var.get() == "a"
    monkeypatch.setenv("FOLD_OPS_TEST_VARIABLE", "b")
    assert var.get() == "b"
    assert parsed == [None, "a", "b"]  # parsed once per value


def test_fx_tracing_is_true_only_while_tracing():
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(fx_tracing())
            return x + 1

    torch.fx.symbolic_trace(Probe())
    Probe()(torch.zeros(1))
    assert seen == [True, False]
    assert not compiling()
