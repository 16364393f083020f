"""Data-stage benchmarks of fold-data (loader, feature caches), CPU."""
