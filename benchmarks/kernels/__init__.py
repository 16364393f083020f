"""Kernel benchmarks: fold-kernels against eager, compiled and peer kernels, launch cost."""
