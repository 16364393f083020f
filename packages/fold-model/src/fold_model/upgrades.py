"""Renames and restackings of fold's own earlier parameter layouts, for state dicts and for
anything else keyed by parameter name (an optimizer's moments, the averaged weights).

A module whose parameters changed layout converts an old state dict when it loads one (a
``load_state_dict`` pre-hook calls :func:`upgrade_state_dict` on its own prefix); fold-train
calls :func:`upgrade_state_dict` on the name -> tensor maps it rebuilds from flat buffers saved
under the old layout. The conversions are per-parameter reshuffles (concatenation along the
output dim, renaming), so they are right for weights and for elementwise optimizer state alike.

Upgrades (each converts every prefix it finds and leaves other keys alone):

* AF3's AdaLN (2026-11-29): ``linear_gate.weight [C, C_s]``, ``linear_gate.bias [C]`` and
  ``linear_shift.weight [C, C_s]`` -> ``linear_gate_shift.weight [2C, C_s]`` (gate rows first)
  and ``gate_bias [C]``.
"""

from __future__ import annotations

from collections.abc import MutableMapping

import torch

__all__ = ["upgrade_state_dict", "stack_gate_shift"]

_GATE_W, _GATE_B, _SHIFT_W = "linear_gate.weight", "linear_gate.bias", "linear_shift.weight"


def stack_gate_shift(state: MutableMapping[str, torch.Tensor], prefix: str = "") -> bool:
    """In place: the AdaLN at ``prefix`` saved with separate gate and shift layers, stacked
    (see the module doc). Returns whether there was one to convert."""
    old = (prefix + _GATE_W, prefix + _SHIFT_W)
    if not all(k in state for k in old):
        return False
    state[prefix + "linear_gate_shift.weight"] = torch.cat([state.pop(k) for k in old])
    if prefix + _GATE_B in state:
        state[prefix + "gate_bias"] = state.pop(prefix + _GATE_B)
    return True


def upgrade_state_dict(state: MutableMapping[str, torch.Tensor]
                       ) -> MutableMapping[str, torch.Tensor]:
    """``state`` (parameter name -> tensor, of a whole model or any part) with every known old
    layout converted in place; returned for convenience."""
    for key in [k for k in state if k.endswith(_GATE_W)]:
        stack_gate_shift(state, key[: -len(_GATE_W)])
    return state
