"""fold-model: AlphaFold2 and AlphaFold3 models in PyTorch with seams for kernels, parallelism and chunking."""

__version__ = "0.1.0"
