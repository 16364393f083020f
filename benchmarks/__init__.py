"""fold's benchmarks: shared code in ``common``, one folder per suite, one-off tools in ``tools``.

Every entry point runs from the repository root as a module, e.g.
``python -m benchmarks.model.evoformer --help`` (see README.md).
"""
