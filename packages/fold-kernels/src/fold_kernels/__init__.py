"""fold-kernels: Portable Triton kernels for AlphaFold-style models: EvoAttention, LayerNorm, fused transitions, fused Adam."""

__version__ = "0.1.0"
