"""The pre-flight of a prediction (``fold-train predict --dry-run``): the peak memory of each stage
for one input, estimated without running the model, and the chunking that fits a device.

The estimate runs the predictor itself (:class:`~fold_train.predict_graphs.AF2Predictor` /
``AF3Predictor``, eager, on the unpadded input) on FakeTensors (``fold_chunk.fake_memory``:
shapes and dtypes, no data, no memory) with one trunk pass and one sampler step (every pass and
step allocates the same) and the first :data:`PLAN_BLOCKS` blocks of each stack
(:func:`first_blocks`: every later block allocates as the second). On a 2-core CPU, ``af3``
with ``--chunk-size 64 --sample-group 1`` and 5 samples: 80 s for 1024 tokens (163 s running
every block, the same bytes), 5.4 min for 4096 (two thirds of it the confidence head, run once
per sample group); checkpoint load and featurisation included. The bytes are counted as
fold-chunk counts them (live-tensor accounting by storage); a stage's peak is the
most bytes live while its module runs, everything live from the stages before included:

* AF2: input embedding, template embedder, extra MSA stack, Evoformer, structure module;
* AF3: input embedding, template embedder, MSA module, Pairformer, diffusion (one sampler step,
  the samples in groups of G), confidence head (groups of G; its PAE / PDE logits reduced to
  the pair confidences inside it, one row block of ``chunk_size`` rows at a time, so the
  reduction is counted in this stage and no ``[S, N, N, 64]`` is).

The FakeTensors are on the device the prediction will run on (:func:`fake_device`: a CUDA
device when planning for one on a machine that has it, else the CPU). fold-model's op registry
picks each op's backend on them as on real tensors and runs its shape-only fake, so on a GPU
with fold-kernels the attention kernels are counted as they run (their outputs and fp32
statistics, no ``[rows, H, N, N]`` logits) and bf16 follows CUDA's autocast; on the CPU the
PyTorch references are counted (with their logits: an upper bound for a GPU with kernels).

The device needs the weights and the input features on top (both counted here, at their size;
under bf16 also the predictor's bf16 copies of the weights, :func:`cast_bytes`).
Not counted: the CUDA context and kernels' workspaces (cuBLAS), and the caching allocator's
fragmentation; :data:`DEVICE_MARGIN` of the budget is left for them.

:func:`plan_chunking` starts from the user's chunk size and sample group (default: none) and,
while the peak exceeds the budget, halves the chunk size (the trunk stacks, confidence
Pairformer and PAE / PDE row blocks, diffusion pair bias) when a trunk-side stage is over, and
the sample group when the diffusion or the confidence head is over; it reports the first plan
that fits, or the smallest one with ``fits: false``.

The same stage accounting on real tensors (:func:`stage_peaks` with ``fake=False``) is the
measured peak the tests compare the estimate with on the CPU.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["AF2_STAGES", "AF3_STAGES", "DEVICE_MARGIN", "PLAN_BLOCKS", "Plan", "StagePeaks",
           "fake_device", "first_blocks", "plan_chunking", "stage_peaks"]

# (stage, model attribute), in the order a prediction runs them
AF2_STAGES = (("input embedding", "input_embedder"), ("template embedder", "template_embedder"),
              ("extra MSA stack", "extra_msa_stack"), ("Evoformer", "evoformer"),
              ("structure module", "structure_module"))
AF3_STAGES = (("input embedding", "input_embedder"), ("template embedder", "template_embedder"),
              ("MSA module", "msa_module"), ("Pairformer", "pairformer"),
              ("diffusion step", "diffusion"), ("confidence head", "confidence_head"))
# stages whose memory the sample group divides (AF3); the others shrink with the chunk size
_SAMPLE_STAGES = {"diffusion step", "confidence head"}
DEVICE_MARGIN = 0.1  # of the budget, for the CUDA context, workspaces and fragmentation
# chunk sizes the plan tries; below 4 the chunk loops cost more than they save (AutoChunk,
# --autochunk, goes further, per stack, on the budget alone)
_CHUNKS = (512, 256, 128, 64, 32, 16, 8, 4)


@dataclass
class StagePeaks:
    """Bytes of tensors live while each stage runs (``stages``, in run order) and the peak of
    the whole prediction (``peak``); activations only (inputs and weights are not counted)."""

    stages: dict[str, int]
    peak: int


def _tensor_bytes(tree: Any) -> int:
    from torch.utils._pytree import tree_flatten

    return sum(t.untyped_storage().nbytes() for t in tree_flatten(tree)[0]
               if isinstance(t, torch.Tensor))


def fake_device(device: torch.device | str | None) -> torch.device:
    """Where a dry run's FakeTensors live: ``device`` when it is a CUDA device of this machine
    (with its index), else the CPU (FakeTensors of a CUDA device need a CUDA build)."""
    device = torch.device(device or "cpu")
    if device.type != "cuda" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device() if device.index is None
                        else device.index)


def stage_peaks(model: torch.nn.Module, stages, run: Callable[[Any], Any], batch: dict,
                *, fake: bool = True, device: torch.device | str | None = None) -> StagePeaks:
    """``run(batch)`` (a prediction of ``batch`` with ``model``) under live-tensor accounting:
    on FakeTensors (``fake``: the estimate; on ``device``, default the tensors' own) or on the
    real tensors (the measurement). A stage's bytes are the most live while its module
    (``stages``: ``(name, model attribute)``) runs, over all its calls."""
    import fold_chunk

    modules = [(name, getattr(model, attr, None)) for name, attr in stages]
    modules = [(name, m) for name, m in modules if m is not None]
    peaks: dict[str, int] = {}
    state: dict[str, Any] = {}

    def pre(name):
        def hook(mod, args):
            state["tracker"].reset_window()
        return hook

    def post(name):
        def hook(mod, args, out):
            peaks[name] = max(peaks.get(name, 0), state["tracker"].window_peak)
        return hook

    handles = []
    for name, m in modules:
        handles.append(m.register_forward_pre_hook(pre(name)))
        handles.append(m.register_forward_hook(post(name)))
    try:
        if fake:
            from fold_model.host_values import batch_slots, known_slots

            # the real batch's filled slots, which the model's inference shortcuts read (read
            # before the fake mode starts)
            facts = batch_slots(batch)
            with (first_blocks(model), fold_chunk.fake_memory(model, device=device) as fr,
                  known_slots(facts)):
                state["tracker"] = fr.tracker
                out = run(fr.fake(batch))
                del out
        else:
            tracker = fold_chunk.AllocationTracker()
            state["tracker"] = tracker
            with torch.no_grad(), tracker:
                out = run(batch)
                del out
        tracker = state["tracker"]
    finally:
        for h in handles:
            h.remove()
    return StagePeaks({name: peaks[name] for name, _ in modules if name in peaks}, tracker.peak)


# blocks of each stack a dry run runs: the first (its inputs may differ: MSA offload, DAP's
# scatter) and one in the steady state; every later block allocates as the second
PLAN_BLOCKS = 2


@contextmanager
def first_blocks(model: torch.nn.Module, keep: int = PLAN_BLOCKS) -> Iterator[None]:
    """Run each stack of identical blocks (fold-model's ``BlockStack``s: Evoformer, extra MSA
    stack, template pair stacks, Pairformer, AF3 MSA module; and the AF3 diffusion transformer)
    with its first ``keep`` blocks only, restored after. A block takes and returns the stack's
    state at the same shapes and keeps nothing, so the most bytes live inside block ``k >= 1``
    are the same for every ``k``: the stage's peak is unchanged, and the fake run of a 48-block
    trunk runs 2 blocks.

    The one thing a block leaves behind: the diffusion transformer's pair biases, which the
    sampler makes for every block beforehand (``DiffusionModule.prepare``). Those are still
    made for the whole count, the kept blocks' repeated, so the bytes they hold are the whole
    stack's."""
    from fold_model.af3.diffusion import DiffusionTransformer
    from fold_model.layers.stack import BlockStack

    stacks = [m for m in model.modules()
              if isinstance(m, (BlockStack, DiffusionTransformer))
              and isinstance(getattr(m, "blocks", None), torch.nn.ModuleList)
              and len(m.blocks) > keep]
    whole = [m.blocks for m in stacks]
    for m in stacks:
        if isinstance(m, DiffusionTransformer):
            n = len(m.blocks)
            m.pair_biases = functools.partial(_whole_pair_biases, m, n)
        m.blocks = torch.nn.ModuleList(list(m.blocks)[:keep])
    try:
        yield
    finally:
        for m, blocks in zip(stacks, whole, strict=True):
            m.blocks = blocks
            m.__dict__.pop("pair_biases", None)


def _whole_pair_biases(stack, n: int, z: torch.Tensor) -> torch.Tensor:
    """``stack.pair_biases(z)`` for ``n`` blocks of a stack cut to its first ones."""
    kept = list(stack.blocks)
    return type(stack).pair_biases(stack, z, [kept[i % len(kept)] for i in range(n)])


def af3_run(model, extent: dict[str, int], *, no_samples: int | None, no_cycles: int = 1,
            no_steps: int = 1, precision: str = "fp32", seed: int = 0,
            device: torch.device | str = "cpu") -> Callable[[dict], Any]:
    """A prediction of a collated AF3 batch of ``extent`` (``fold_train.buckets.real_extent``
    of the real batch) by the eager AF3Predictor on ``device``."""
    from fold_train.predict_graphs import AF3Predictor

    def run(batch: dict) -> Any:
        # the weight casts are counted with the weights (cast_bytes), not as live activations
        predictor = AF3Predictor(model, device, precision=precision, cuda_graphs=False,
                                 cast_weights_once=False)
        generator = torch.Generator(device=torch.device(device)).manual_seed(seed)
        return predictor(batch, generator=generator,
                         no_cycles=no_cycles, no_samples=no_samples, no_steps=no_steps,
                         extent=extent)
    return run


def af2_run(model, extent: dict[str, int], *, num_recycles: int = 1,
            precision: str = "fp32", device: torch.device | str = "cpu",
            ) -> Callable[[dict], Any]:
    """A prediction of a collated AF2 batch of ``extent`` by the eager AF2Predictor on
    ``device``."""
    from fold_train.predict_graphs import AF2Predictor

    def run(batch: dict) -> Any:
        return AF2Predictor(model, device, precision=precision, cuda_graphs=False,
                            cast_weights_once=False)(
            batch, num_recycles=num_recycles, extent=extent)
    return run


@dataclass
class Plan:
    """A dry run's result: per stage the bytes the device needs (weights, features and the
    stage's live activations), the chunking, and whether it fits ``budget`` (less the margin)."""

    budget: int
    weights: int
    features: int
    chunk_size: int | None
    sample_group: int | None
    stages: dict[str, int]
    peak: int
    fits: bool
    tried: list[dict] = field(default_factory=list)
    device: str = "cpu"  # where the FakeTensors were (fake_device)

    @property
    def usable(self) -> int:
        return int(self.budget * (1 - DEVICE_MARGIN))

    def summary(self) -> dict:
        from fold_data.limits import format_bytes

        base = self.weights + self.features
        flags = []
        if self.chunk_size:
            flags += ["--chunk-size", str(self.chunk_size)]
        if self.sample_group:
            flags += ["--sample-group", str(self.sample_group)]
        return {
            "fits": self.fits, "budget_bytes": self.budget, "usable_bytes": self.usable,
            "weights_bytes": self.weights, "features_bytes": self.features,
            "peak_bytes": base + self.peak,
            "stages": {k: {"bytes": base + v, "human": format_bytes(base + v)}
                       for k, v in self.stages.items()},
            "chunk_size": self.chunk_size, "sample_group": self.sample_group,
            "flags": flags, "tried": self.tried,
            "method": f"FakeTensor run of the predictor on {self.device} (one trunk pass, one "
                      f"sampler step, the first {PLAN_BLOCKS} blocks of each stack; each op "
                      "counted as the backend serving it there runs), "
                      "live-tensor accounting (fold_chunk); weights and features added",
        }


def _smaller_chunk(chunk: int | None, extent: int) -> int | None:
    """The next chunk size below ``chunk`` (None: no chunking) that splits ``extent`` rows."""
    for c in _CHUNKS:
        if c < (chunk or extent) and c < extent:
            return c
    return None


def cast_bytes(model, precision: str) -> int:
    """The predictor's weight casts under bf16 (``fold_ops.weight_casts``): at most one bf16
    copy of each fp32 parameter (LayerNorm's are not cast: a slight overcount)."""
    if precision != "bf16":
        return 0
    return sum(2 * p.numel() for p in model.parameters() if p.dtype == torch.float32)


def plan_chunking(model, family: str, batch: dict, budget: int, *,
                  chunk_size: int | None = None, sample_group: int | None = None,
                  no_samples: int | None = None, precision: str = "fp32",
                  device: torch.device | str | None = None) -> Plan:
    """The first chunking that fits ``budget`` bytes (see the module doc); ``batch``: the
    collated inference sample, on the CPU; ``model``: on the CPU, in eval mode; ``device``:
    the device the prediction will run on (FakeTensors there when :func:`fake_device` allows;
    default the CPU)."""
    from fold_train.buckets import real_extent

    model.eval()
    weights = _tensor_bytes(list(model.parameters()) + list(model.buffers()))
    weights += cast_bytes(model, precision)
    features = _tensor_bytes(batch)  # the batch copied to the device
    real = real_extent(batch, family)
    on = fake_device(device)
    if family == "af3":
        extent = real["N_token"]
        samples = no_samples or model.config.sampler.no_samples
        stages = AF3_STAGES
        run = af3_run(model, real, no_samples=samples, precision=precision, device=on)
    else:
        extent = real["N_res"]
        samples = None
        stages = AF2_STAGES
        run = af2_run(model, real, precision=precision, device=on)
    usable = int(budget * (1 - DEVICE_MARGIN)) - weights - features
    tried: list[dict] = []
    chunk, group = chunk_size, sample_group
    while True:
        model.set_chunk_size(chunk)
        if family == "af3":
            model.set_sample_group_size(group)
        peaks = stage_peaks(model, stages, run, batch, device=on)
        over = [k for k, v in peaks.stages.items() if v > usable]
        tried.append({"chunk_size": chunk, "sample_group": group,
                      "peak_bytes": peaks.peak + weights + features})
        fits = peaks.peak <= usable
        if fits:
            break
        # which knob: the sample group for the diffusion / confidence stages, else the chunk
        shrink_group = samples is not None and (group or samples) > 1 and \
            any(k in _SAMPLE_STAGES for k in over)
        next_chunk = _smaller_chunk(chunk, extent)
        if shrink_group:
            group = math.ceil((group or samples) / 2)
        elif next_chunk is not None:
            chunk = next_chunk
        elif samples is not None and (group or samples) > 1:
            group = math.ceil((group or samples) / 2)
        else:
            break  # nothing left to shrink: the smallest plan, reported as not fitting
    model.set_chunk_size(None)
    if family == "af3":
        model.set_sample_group_size(None)
    return Plan(budget, weights, features, chunk, group, peaks.stages, peaks.peak, fits, tried,
                str(on))


def dry_run(args, device: str) -> dict:
    """``fold-train predict --dry-run``: the input featurised (on the CPU), the model loaded on
    the CPU, :func:`plan_chunking` for ``--memory-limit`` (default: what ``device`` has free) on
    FakeTensors of ``device`` (a CUDA device of this machine; else the CPU);
    returns the printed JSON summary (``fits``, per-stage bytes, the flags to use)."""
    from fold_data.limits import limits_from_args, use_limits

    from fold_train.data import collate
    from fold_train.errors import ConfigError
    from fold_train.memory_estimate import budget_bytes
    from fold_train.predict import load_trained_model

    if getattr(args, "input_dir", None):
        raise ConfigError("--dry-run plans one input (--json, --fasta or --mmcif), not "
                          "--input-dir")
    family = "af3" if getattr(args, "json", None) else "af2"
    if getattr(args, "autochunk", None) is not None:
        raise ConfigError("--dry-run plans --chunk-size / --sample-group; AutoChunk plans each "
                          "stack on its first call (drop --autochunk, or run without --dry-run)")
    model, cfg = load_trained_model(args.checkpoint, "cpu", use_ema=not args.no_ema,
                                    family=family)
    limits = limits_from_args(args)
    if family == "af3":
        from fold_data.af3 import make_sample

        from fold_train.af3_data import make_ccd
        from fold_train.predict_af3 import make_af3_inputs

        entry, raw = make_af3_inputs(args.json, make_ccd(args.ccd or []), limits=limits,
                                     allow_outside_paths=getattr(args, "allow_outside_paths",
                                                                 False),
                                     features=getattr(args, "search_features", None))
        name = entry.name
        batch = collate([make_sample(raw, "af3_predict", seed=0)])
        sizes = {"n_token": int(len(raw["asym_id"])), "n_atom": int(len(raw["atom_to_token"]))}
    else:
        from fold_data.af2 import make_sample

        from fold_train.predict import make_raw_features

        if getattr(args, "sample_group", None):
            raise ConfigError("--sample-group is for AF3 inputs (AF2 has no diffusion samples)")
        with use_limits(limits):
            name, raw, _ = make_raw_features(
                fasta=args.fasta, mmcif=args.mmcif, chain=args.chain, msas=args.msa or [],
                template_hits=args.templates, template_mmcif_dir=args.template_mmcif_dir)
        batch = collate([make_sample(raw, cfg.data_preset(), seed=0, training=False)])
        sizes = {"n_res": int(raw["seq_length"])}
    budget = budget_bytes(device, getattr(args, "memory_limit", None))
    plan = plan_chunking(model, family, batch, budget, chunk_size=args.chunk_size,
                         sample_group=getattr(args, "sample_group", None),
                         no_samples=getattr(args, "samples", None),
                         precision=cfg.system.precision, device=device)
    out = {"dry_run": True, "name": name, "family": family, "device": str(device), **sizes,
           "precision": cfg.system.precision, **plan.summary()}
    if getattr(args, "msa_offload", False):  # the CPU fake run cannot tell host from device
        out["note"] = ("--msa-offload is not modelled: the MSA is counted on the device (an "
                       "upper bound)")
    return out
