"""Multi-GPU benchmarks of fold-parallel (DAP, DAO, BP), run under torchrun."""
