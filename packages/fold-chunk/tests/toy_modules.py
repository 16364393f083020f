"""Small fx-traceable modules of our own (no fold_model): attention with pair bias, a
triangle-multiplication-like einsum block, a transition, and a stack of the three."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class ToyAttentionPairBias(nn.Module):
    """Gated row attention with pair bias: ``m [N_seq, N_res, C_m]``, ``z [N_res, N_res,
    C_z]``, ``mask [N_seq, N_res]`` -> ``m``."""

    def __init__(self, c_m: int = 12, c_z: int = 6, heads: int = 3, c_h: int = 5) -> None:
        super().__init__()
        self.heads, self.c_h = heads, c_h
        self.ln_m = nn.LayerNorm(c_m)
        self.ln_z = nn.LayerNorm(c_z)
        self.qkvg = nn.Linear(c_m, 4 * heads * c_h)
        self.bias = nn.Linear(c_z, heads, bias=False)
        self.out = nn.Linear(heads * c_h, c_m)

    def forward(self, m: torch.Tensor, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.ln_m(m)
        parts = self.qkvg(x).chunk(4, dim=-1)
        q, k, v, g = parts[0], parts[1], parts[2], parts[3]
        q = q.unflatten(-1, (self.heads, self.c_h)).transpose(-2, -3)  # [S, H, N, D]
        k = k.unflatten(-1, (self.heads, self.c_h)).transpose(-2, -3)
        v = v.unflatten(-1, (self.heads, self.c_h)).transpose(-2, -3)
        bias = self.bias(self.ln_z(z)).permute(2, 0, 1)  # [H, N, N]
        logits = torch.matmul(q, k.transpose(-1, -2)) * self.c_h**-0.5 + bias
        logits = logits + (mask[:, None, None, :] - 1.0) * 1e9  # [S, H, N, N]
        o = torch.matmul(torch.softmax(logits, dim=-1), v)  # [S, H, N, D]
        o = o.transpose(-2, -3).reshape(m.shape[0], m.shape[1], -1) * torch.sigmoid(g)
        return m + self.out(o)


class ToyTriangleMultiplication(nn.Module):
    """Outgoing triangle update: ``z [N, N, C]``, ``mask [N, N]`` -> ``z``."""

    def __init__(self, c: int = 6, c_h: int = 7) -> None:
        super().__init__()
        self.c_h = c_h
        self.ln_in = nn.LayerNorm(c)
        self.a = nn.Linear(c, 2 * c_h)
        self.b = nn.Linear(c, 2 * c_h)
        self.ln_out = nn.LayerNorm(c_h)
        self.proj = nn.Linear(c_h, c)
        self.gate = nn.Linear(c, c)

    def forward(self, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.ln_in(z)
        a = self.a(x).split(self.c_h, dim=-1)
        b = self.b(x).split(self.c_h, dim=-1)
        a = a[0] * torch.sigmoid(a[1]) * mask.unsqueeze(-1)
        b = b[0] * torch.sigmoid(b[1]) * mask.unsqueeze(-1)
        p = torch.einsum("ikc,jkc->ijc", a, b)  # [N, N, C_h]: contraction over k
        return z + torch.sigmoid(self.gate(x)) * self.proj(self.ln_out(p))


class ToyTransition(nn.Module):
    def __init__(self, c: int = 6, n: int = 4) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(c)
        self.l1 = nn.Linear(c, n * c)
        self.l2 = nn.Linear(n * c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.l2(F.relu(self.l1(self.ln(x))))


class ToyStack(nn.Module):
    """Two rounds of attention, triangle update and transition: ``(m, z, m_mask, z_mask)``."""

    def __init__(self, c_m: int = 12, c_z: int = 6) -> None:
        super().__init__()
        self.att = nn.ModuleList(ToyAttentionPairBias(c_m, c_z) for _ in range(2))
        self.tri = nn.ModuleList(ToyTriangleMultiplication(c_z) for _ in range(2))
        self.trans = nn.ModuleList(ToyTransition(c_z) for _ in range(2))

    def forward(self, m, z, m_mask, z_mask):
        for att, tri, trans in zip(self.att, self.tri, self.trans):
            m = att(m, z, m_mask)
            z = trans(tri(z, z_mask))
        return m, z


class ToyResidualLayerNorm(nn.Module):
    """``LayerNorm(x + f(x))`` with ``f`` a transition (post-LN residual block):
    ``x [N_i, N_j, C]`` -> same shape."""

    def __init__(self, c: int = 8, n: int = 4) -> None:
        super().__init__()
        self.l1 = nn.Linear(c, n * c)
        self.l2 = nn.Linear(n * c, c)
        self.ln = nn.LayerNorm(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x + self.l2(F.relu(self.l1(x))))
