"""Model benchmarks: fold-model blocks, the full AF2 step, AF3 losses, blocks against peers."""
