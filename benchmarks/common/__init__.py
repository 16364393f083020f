"""Code the benchmarks share: op backends, CUDA graphs, memory, machine information, the atomic
results writer, synthetic batches and the blocks they time. Nothing here is an entry point."""
