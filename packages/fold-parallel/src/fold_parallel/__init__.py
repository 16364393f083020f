"""fold-parallel: Dynamic Axial Parallelism, Duality Async Operations and Branch Parallelism for AlphaFold-style models."""

__version__ = "0.1.0"
