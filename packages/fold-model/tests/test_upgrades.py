"""fold_model.upgrades: state dicts of fold's earlier parameter layouts convert to the current
one (AF3's AdaLN: separate gate and shift layers -> one stacked projection)."""

from __future__ import annotations

import torch
from fold_model.af2 import AlphaFold2
from fold_model.af2 import config as af2_config
from fold_model.af3 import AlphaFold3
from fold_model.af3 import config as af3_config
from fold_model.upgrades import upgrade_state_dict


def _as_old(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` as fold saved it before the stacked AdaLN projection."""
    out = {}
    for name, t in state.items():
        if name.endswith("linear_gate_shift.weight"):
            prefix = name[: -len("linear_gate_shift.weight")]
            out[prefix + "linear_gate.weight"], out[prefix + "linear_shift.weight"] = \
                t.chunk(2, 0)
        elif name.endswith(".gate_bias"):
            out[name[: -len("gate_bias")] + "linear_gate.bias"] = t
        else:
            out[name] = t
    return out


def test_af3_state_dict_of_the_old_layout_upgrades_and_loads():
    torch.manual_seed(0)
    model = AlphaFold3(af3_config("tiny"))
    new = model.state_dict()
    old = _as_old(new)
    n_adaln = sum(k.endswith("linear_gate_shift.weight") for k in new)
    assert n_adaln > 0 and sum(k.endswith("linear_gate.weight") for k in old) == n_adaln
    upgraded = upgrade_state_dict(dict(old))
    assert set(upgraded) == set(new)
    assert all(torch.equal(upgraded[k], v) for k, v in new.items())
    again = AlphaFold3(af3_config("tiny"))
    again.load_state_dict(old)  # strict: each AdaLN's pre-hook converts its own keys
    assert all(torch.equal(again.state_dict()[k], v) for k, v in new.items())


def test_other_state_dicts_pass_unchanged():
    state = AlphaFold2(af2_config("tiny")).state_dict()
    upgraded = upgrade_state_dict(dict(state))
    assert upgraded.keys() == state.keys()
    assert all(upgraded[k] is v for k, v in state.items())
