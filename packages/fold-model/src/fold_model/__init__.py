"""fold-model: AlphaFold2 (and AlphaFold3) models with seams for kernels, parallelism, chunking."""

__version__ = "0.1.0"
