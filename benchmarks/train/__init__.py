"""Training and prediction benchmarks through fold-train (ablations, AF3 iteration, graphs)."""
