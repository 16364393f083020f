"""fold-parallel: Dynamic Axial Parallelism (DAP), Duality Async Operations (DAO) and Branch
Parallelism (BP) for AlphaFold-style models, and the process groups for hybrid DP x BP x DAP.

Modules: :mod:`~fold_parallel.comm` (autograd collectives), :mod:`~fold_parallel.dao` (async
pairs), :mod:`~fold_parallel.dap` (``DapComm``, ``enable_dap``), :mod:`~fold_parallel.bp`
(``enable_bp``), :mod:`~fold_parallel.groups` (mesh, torchrun init), :mod:`~fold_parallel.ddp`
(gradient sync), :mod:`~fold_parallel.guard` (consistency checks, clear failures),
:mod:`~fold_parallel.volume` (communication volume).
"""

from fold_parallel.bp import enable_bp
from fold_parallel.comm import Collectives
from fold_parallel.dap import DapComm, enable_dap, pad_to_multiple
from fold_parallel.ddp import sync_gradients
from fold_parallel.groups import (
    ParallelConfig,
    ParallelGroups,
    build_groups,
    init_distributed,
    seed_ranks,
)
from fold_parallel.guard import CollectiveError, ConsistencyError, check_consistent

__version__ = "0.1.0"

__all__ = [
    "Collectives",
    "DapComm",
    "enable_dap",
    "pad_to_multiple",
    "enable_bp",
    "sync_gradients",
    "ParallelConfig",
    "ParallelGroups",
    "build_groups",
    "init_distributed",
    "seed_ranks",
    "CollectiveError",
    "ConsistencyError",
    "check_consistent",
]
