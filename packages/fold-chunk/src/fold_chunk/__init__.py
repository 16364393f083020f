"""fold-chunk: AutoChunk: automatic chunking of traceable PyTorch modules within a memory budget."""

__version__ = "0.1.0"
