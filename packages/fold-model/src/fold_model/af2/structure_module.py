"""AF2 structure module (supplement 1.8, Algorithms 20-24).

Invariant point attention (Alg. 22), the quaternion backbone update (Alg. 23), the torsion-angle
ResNet and the per-layer frames -> atom14 reconstruction (Alg. 24). Runs in float32 even under
autocast: rotations composed over 8 layers in bf16 drift off SO(3).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StructureModuleConfig"]


@dataclass
class StructureModuleConfig:
    """Structure-module hyper-parameters; defaults from the AF2 supplement 1.8, Alg. 20-22."""

    c_ipa: int = 16  # per-head hidden size of IPA's scalar queries/keys/values
    c_resnet: int = 128  # hidden size of the torsion-angle ResNet (Alg. 20 lines 11-14)
    no_heads_ipa: int = 12
    no_qk_points: int = 4
    no_v_points: int = 8
    dropout_rate: float = 0.1
    no_blocks: int = 8  # N_layer; the weights are shared between the 8 iterations
    no_transition_layers: int = 1  # blocks of Linear-ReLU-Linear-ReLU-Linear (Alg. 20 line 8)
    no_resnet_blocks: int = 2
    no_angles: int = 7  # omega, phi, psi, chi1-4
    trans_scale_factor: float = 10.0  # nm -> Angstrom (the supplement's position scale)
    epsilon: float = 1e-8
    inf: float = 1e5
