"""torchrun worker of ``test_layout_context.py``: a world of 3 ranks, a DAP-2 layout on ranks 0
and 1 (``fold_train.distributed.layout_context``), one Trainer step per DAO setting on the saved
batch; rank 2 is outside the layout and waits. Each rank saves what it saw to ``<out>/rankN.pt``.

    torchrun --standalone --nproc-per-node 3 _layout_worker.py BATCH OUT N_CYCLE KEY=VALUE ...
"""

from __future__ import annotations

import sys
import tempfile

import torch
import torch.distributed as dist
from fold_train.config import apply_overrides, preset
from fold_train.distributed import layout_context, setup, teardown
from fold_train.loop import Trainer


def main(batch_path: str, out: str, n_cycle: str, *overrides: str) -> None:
    torch.set_num_threads(1)
    ctx = setup("cpu")
    lay = layout_context(ctx, 2, dap=2)  # every rank: group creation is collective
    got: dict = {"in_layout": lay is not None}
    if lay is not None:
        got.update(world_size=lay.world_size, dp_size=lay.dp_size,
                   group=dist.get_process_group_ranks(lay.group),
                   dap_group=dist.get_process_group_ranks(lay.groups.dap_group))
        batch = torch.load(batch_path, weights_only=True)
        for dao in (True, False):
            cfg = apply_overrides(preset("tiny"), [*overrides, "dap=2", f"dao={dao}"])
            with tempfile.TemporaryDirectory() as run_dir:
                trainer = Trainer(cfg, run_dir, None, ctx=lay, progress=False)
                comm = trainer.model.evoformer.comm
                record = trainer.train_step(batch, n_cycle=int(n_cycle))
            got[f"dao={dao}"] = {"loss": record["loss"], "grad_norm": record["grad_norm"],
                                 "handles": len(trainer._parallel_handles),
                                 "overlap": (comm.overlap_forward, comm.overlap_backward)}
    torch.save(got, f"{out}/rank{ctx.rank}.pt")
    dist.barrier()  # rank 2 waits here while the layout trains
    teardown(ctx)


if __name__ == "__main__":
    main(*sys.argv[1:])
