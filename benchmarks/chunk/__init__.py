"""fold-chunk benchmark: AutoChunk against no chunking and manual chunks."""
