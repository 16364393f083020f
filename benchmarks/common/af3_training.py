"""The AF3 training iteration of the benchmarks, through fold-train's Trainer: the rows'
switches (each row adds one optimization to the rows above), the ``key=value`` overrides that
make them, the Trainer of a configuration and one seeded iteration, and the sizes of the full and
tiny runs. For train/af3.py and tools/profile_af3_step.py."""

from __future__ import annotations

import dataclasses
import gc
import math

import torch
from fold_train.ckpt_plan import SavedTensorMemory
from fold_train.config import apply_overrides
from fold_train.config import preset as train_preset
from fold_train.cuda_graphs import EagerCapture
from fold_train.distributed import DistContext
from fold_train.loop import Trainer

FULL = {"n_token": 384, "n_msa": 1024, "n_templ": 4, "cycles": 4, "crop_start": 384,
        "crop_resolution": 32, "max_tokens": 4096}
TINY = {"n_token": 24, "n_msa": 6, "n_templ": 2, "cycles": 2, "crop_start": 16,
        "crop_resolution": 4, "max_tokens": 48}


@dataclasses.dataclass(frozen=True)
class Switches:
    """The optimizations a row turns on (module docstring of train/af3.py)."""

    backend: str = "torch"
    flat_adam: bool = False
    bf16_params: bool = False
    lean_ckpt: bool = False
    ckpt_plan: bool = False
    gc_off: bool = False
    graphs: bool = False


ROWS: list[tuple[str, str, dict]] = [
    ("eager", "eager (torch ops, fp32 weights + bf16 autocast, Adam)", {}),
    ("kernels", "+ fused kernels (Triton where supported)", {"backend": "auto"}),
    ("flat_adam", "+ flat buffers + fused Adam+EMA", {"flat_adam": True}),
    ("bf16", "+ bf16 weights of the stacks (fp32 master)", {"bf16_params": True}),
    ("lean_ckpt", "+ whole-block checkpointing (trunk blocks, atom transformer blocks)",
     {"lean_ckpt": True}),
    ("ckpt_plan", "+ checkpointing only where needed", {"ckpt_plan": True}),
    ("gc_off", "+ GC off", {"gc_off": True}),
    # without ckpt_plan (whose change of checkpointing forces a second capture): captures in this
    # loop failed on the H100 until it was dropped and GC off moved after the capturing steps;
    # the graphed step keeps whole-block checkpointing
    ("graphs", "+ CUDA graphs (forward + losses + backward replayed), full lean checkpointing",
     {"graphs": True, "ckpt_plan": False}),
]


def cumulative(rows: list[str]) -> dict[str, Switches]:
    """The switches of each row named in ``rows``: every row adds its change to those above."""
    sw, out = Switches(), {}
    for key, _, change in ROWS:
        sw = dataclasses.replace(sw, **change)
        if key in rows:
            out[key] = sw
    return out


def sync(device: torch.device) -> None:
    """Wait for the device's work (CUDA); nothing on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    """Collect garbage and empty the CUDA cache (between rows and probes)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


PLAN_FILL = 0.9  # ckpt_memory_fraction of the ckpt_plan row (no CUDA graph pools beside it)
CPU_PLAN_HEADROOM = 2**30  # CPU: the plan's budget is the checkpointed step's bytes + 1 GiB


def _flag(x: bool) -> str:
    return str(x).lower()


def overrides(sw: Switches, cuda: bool, cycles: int) -> list[str]:
    """The ``key=value`` options of fold-train's ``af3`` (or ``af3_tiny``) preset that make
    ``sw``'s training iteration: bf16 autocast on every row, the preset's per-sub-layer
    checkpointing (``lean_ckpt``: whole blocks and the atom transformers; ``ckpt_plan``:
    ``activation_checkpointing=auto``), ``cycles`` trunk passes at most."""
    backend = sw.backend if cuda or sw.backend == "torch" else "auto"  # CPU: the reference
    return ["precision=bf16", f"ops_backend={backend}", f"tensor_fusion={_flag(sw.flat_adam)}",
            "use_kernels=" + (("true" if cuda else "none") if sw.flat_adam else "false"),
            f"bf16_weights={_flag(sw.bf16_params)}",
            "activation_checkpointing=" + ("auto" if sw.ckpt_plan else "true"),
            "model.checkpoint=true",  # what auto plans from (the tiny preset has it off)
            f"ckpt_memory_fraction={PLAN_FILL}",
            f"model.checkpoint_blocks={_flag(sw.lean_ckpt)}",
            f"model.checkpoint_atoms={_flag(sw.lean_ckpt)}",
            f"cuda_graphs={_flag(sw.graphs)}", f"gc_off={_flag(sw.gc_off)}",
            f"max_recycling_iters={cycles - 1}", "loader_workers=0"]


class _HeadroomMemory(SavedTensorMemory):
    """CPU: the bytes autograd saves during the step, against the fully checkpointed step's
    bytes plus a fixed headroom (there is no device memory to plan against)."""

    def __init__(self, headroom: int) -> None:
        super().__init__(0)
        self.headroom = headroom
        self.first: int | None = None

    def measure(self, step) -> int:
        used = super().measure(step)
        if self.first is None:
            self.first = used
            self.budget_bytes = used + self.headroom
        return used


def make_trainer(sw: Switches, tiny: bool, device: torch.device, run_dir: str, cycles: int
                 ) -> tuple[Trainer, list[str]]:
    """The fold-train Trainer of a configuration (no data stream: the benchmark gives the
    batch) and the notes of what the CPU cannot run."""
    cuda = device.type == "cuda"
    notes = []
    if sw.backend != "torch" and not cuda:
        notes.append("kernels: torch reference on CPU")
    if sw.flat_adam and not cuda:
        notes.append("Adam: PyTorch path on CPU")
    if sw.graphs and not sw.flat_adam:
        raise ValueError("the graphs row needs flat_adam (gradients at fixed addresses)")
    graph_backend = None
    if sw.graphs and not cuda:
        graph_backend = EagerCapture()
        notes.append("graphs: the captured body run eagerly on CPU")
    memory = None
    if sw.ckpt_plan and not cuda:
        memory = _HeadroomMemory(CPU_PLAN_HEADROOM)
        notes.append("checkpointing plan: saved-tensor bytes against 1 GiB of headroom on CPU")
    cfg = apply_overrides(train_preset("af3_tiny" if tiny else "af3"),
                          overrides(sw, cuda, cycles))
    trainer = Trainer(cfg, run_dir, None, ctx=DistContext(device=device), progress=False,
                      graph_backend=graph_backend, ckpt_memory=memory)
    return trainer, notes


def train_iteration(trainer: Trainer, batch: dict[str, torch.Tensor], n_cycle: int,
                    seed: int) -> float:
    """One training iteration through the Trainer (forward, losses, backward, clipping, Adam,
    EMA; gc_off as in its loop); returns the loss. The global RNG (dropout) is reseeded with
    ``seed`` so that every configuration draws the same masks; the diffusion noise is the
    Trainer's, seeded by its step number."""
    torch.manual_seed(seed)
    record = trainer.run_steps([batch], n_cycle=n_cycle)[0]
    return math.nan if record.get("skipped") else record["loss"]
