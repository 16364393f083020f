"""The ``fold-train`` command.

    fold-train train    --preset tiny --data DATA_DIR [--run-dir RUN] [--resume] [key=value ...]
    fold-train train    --preset af2_initial --print-config [key=value ...]
    fold-train train    --preset af3_tiny --data COMPLEX_DIR [--ccd CCD.cif]   (AlphaFold3)
    fold-train predict  --checkpoint CKPT (--fasta F | --mmcif F --chain C) [--msa A ...]
                        [--out X.cif]
    fold-train predict  --checkpoint AF3_CKPT --json INPUT.json [--out X.cif]   (AlphaFold3)
                        [--out-dir OUT] [--seeds 1,2] [--samples 5]   (every sample, ranked)
    fold-train predict  --checkpoint CKPT --input-dir DIR --out-dir OUT   (many inputs)
    torchrun --nproc-per-node N -m fold_train.cli predict ... --dap N   (one input, N GPUs)
    fold-train evaluate PRED TRUE [--chain C]          (files, or directories of predictions)
    fold-train import-weights params_model_1_ptm.npz --out af2.ckpt   (AF2 / OpenFold weights)
    fold-train import-weights protenix.pt --from protenix --out af3.ckpt   (Protenix AF3)
    fold-train cache    DATA_DIR --out CACHE_DIR ...   (fold-data's cache builder)
    fold-train demo     [--data data/demo]             (the README's main job)

Multi-GPU / multi-node: ``torchrun --nproc-per-node G -m fold_train.cli train ...`` (data
parallel: every rank trains on its own share of the sample stream and the flat gradient buffer is
averaged; ``dap=N bp=2`` split each replica's model over N x 2 ranks with fold-parallel's
Dynamic Axial and Branch Parallelism). AF3 presets train data parallel the same way
(``torchrun --nproc-per-node G -m fold_train.cli train --preset af3 --data COMPLEX_DIR``),
with ``--dap N`` too (no ``--bp``: branch parallelism is the AF2 Parallel Evoformer's).
Exit status: 0 on success, 1 on bad input or failed training, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["build_parser", "main"]

DEFAULT_RUN_DIR = "runs/latest"


def _chain_list(text: str) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()]


def _memory_budget(text: str):
    from fold_train.autochunk import parse_memory_budget

    try:
        return parse_memory_budget(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# -- train --------------------------------------------------------------------------------------
def _train_overrides(args: argparse.Namespace) -> list[str]:
    """The ``key=value`` overrides with ``--dap``/``--bp`` folded in (flags first, so an
    explicit ``dap=``/``bp=`` override given after them wins)."""
    flags = []
    if getattr(args, "dap", None) is not None:
        flags.append(f"parallel.dap={args.dap}")
    if getattr(args, "bp", None) is not None:
        flags.append(f"parallel.bp={args.bp}")
    return [*flags, *args.overrides]


def run_training(args: argparse.Namespace) -> tuple[object, list[dict]]:
    """Build everything ``fold-train train`` needs and run it; returns (trainer, records).

    Under torchrun: data parallel. Rank 0 builds the family's feature cache while the others
    wait, then every replica reads its own share of the sample stream (``s = dp_rank mod DP``)
    and the flat gradient buffer is averaged over the ranks each step; ``dap``/``bp`` split each
    replica's model over its ranks (fold-parallel)."""
    from fold_data.limits import limits_from_args

    from fold_train.config import apply_overrides, preset
    from fold_train.data import SampleStream
    from fold_train.distributed import model_parallel, setup

    cfg = apply_overrides(preset(args.preset), _train_overrides(args))
    if args.data is None and args.cache is None:
        raise SystemExit("fold-train train: give --data DATA_DIR (and/or --cache CACHE_DIR)")
    _check_run_dir(args)
    family = cfg.family
    data_preset = cfg.data_preset()
    family.check_data(cfg, data_preset)
    ctx = model_parallel(setup(args.device), dap=cfg.parallel.dap, bp=cfg.parallel.bp)
    cache_dir = args.cache or str(Path(args.run_dir) / "cache")
    held = list(args.hold_out or [])
    entries = family.open_cache(args.data, cache_dir, ctx, chains=args.chains,
                                workers=args.cache_workers, ccd=getattr(args, "ccd", None) or [],
                                progress=not args.no_progress,
                                limits=limits_from_args(args))
    train = _training_entries(entries, held, cache_dir, family.unit)
    train, units = family.training_units(cache_dir, train, data_preset)  # filters, weights
    eval_set = family.eval_samples(cache_dir, [e for e in entries if e[0] in held], data_preset,
                                   ctx)
    stream = SampleStream(cache_dir, train, data_preset, seed=cfg.run.seed,
                          batch_size=cfg.run.batch_size, rank=ctx.dp_rank,
                          world_size=ctx.dp_size, workers=cfg.data.workers,
                          prefetch=cfg.data.prefetch, family=family.name, units=units)
    bp = f" x BP {cfg.parallel.bp}" if family.branch_parallel else ""
    trainer = _start_trainer(args, cfg, ctx, stream, eval_set, lambda n_params: (
        f"{family.run_label} {cfg.run.preset}, {n_params} parameters on {ctx.device} x "
        f"{ctx.world_size} (DP {ctx.dp_size}{bp} x DAP {cfg.parallel.dap}), "
        f"{len(train)} training {_plural(family.unit)}{_held_text(held)}"))
    return trainer, trainer.fit()


def _check_run_dir(args: argparse.Namespace) -> None:
    """Refuse a run directory holding another run unless --resume / --overwrite (every rank
    checks; only rank 0 deletes for --overwrite)."""
    import os

    from fold_train.run_dir import prepare_run_dir

    prepare_run_dir(args.run_dir, resume=bool(args.resume or args.resume_from),
                    overwrite=bool(getattr(args, "overwrite", False)),
                    remove=os.environ.get("RANK", "0") == "0")


def _training_entries(entries: list[tuple[str, str]], held: list[str], cache_dir: str,
                      kind: str) -> list[tuple[str, str]]:
    """The cache's ``(name, key)`` entries less the held-out ones; a held-out name missing from
    the cache, or nothing left to train on, is a clear error."""
    from fold_data.errors import InputError

    plural = _plural(kind)
    missing = sorted(set(held) - {n for n, _ in entries})
    if missing:
        raise InputError(cache_dir, ", ".join(missing), f"held-out {plural} are not in the cache")
    train = [e for e in entries if e[0] not in held]
    if not train:
        raise InputError(cache_dir, None, f"expected at least one training {kind} besides the "
                                          f"held-out ones")
    return train


def _plural(kind: str) -> str:
    return "complexes" if kind == "complex" else f"{kind}s"


def _held_text(held: list[str]) -> str:
    return f", held out: {', '.join(held)}" if held else ""


def _start_trainer(args: argparse.Namespace, cfg, ctx, stream, eval_set, describe):
    """The Trainer of either model family, resumed when asked; rank 0 prints ``describe(n)``
    (n: the parameter count) and the run directory."""
    from fold_train.config import ConfigError
    from fold_train.loop import Trainer

    init_from = getattr(args, "init_from", None)
    if init_from and (args.resume or args.resume_from):
        raise ConfigError("--init-from starts a new run from weights only; --resume continues "
                          "a run: give one of them")
    trainer = Trainer(cfg, args.run_dir, stream, ctx=ctx, eval_set=eval_set,
                      progress=not args.no_progress, init_from=init_from)
    if init_from and ctx.is_main:
        print(f"fold-train: weights from {init_from}; optimizer and step start fresh")
    if args.resume or args.resume_from:
        step = trainer.resume(args.resume_from)
        if ctx.is_main:
            print(f"fold-train: resumed at step {step} from {args.run_dir}")
    if ctx.is_main:
        n_params = sum(p.numel() for p in trainer.model.parameters())
        print(f"fold-train: {describe(n_params)}; run directory {args.run_dir}")
    return trainer


def _asdict(obj) -> dict:
    import dataclasses

    return dataclasses.asdict(obj)


def _print_records(records: list[dict], every: int, columns) -> None:
    """A table of the step records: the loss, the family's ``columns`` (``(key, title)``),
    N_cycle and the step time."""
    width = {title: max(7, len(title)) for _, title in columns}
    print(f"{'step':>5} {'loss':>8} " + " ".join(f"{t:>{width[t]}}" for _, t in columns)
          + f" {'N_cycle':>7} {'s/step':>6}")
    for r in records:
        if r["step"] % every == 0 or r is records[-1] or r is records[0]:
            print(f"{r['step']:5d} {r['loss']:8.4f} "
                  + " ".join(f"{r.get(k, float('nan')):{width[t]}.4f}" for k, t in columns)
                  + f" {r['n_cycle']:7d} {r['step_time']:6.2f}")


def cmd_train(args: argparse.Namespace) -> int:
    if args.print_config:
        from fold_train.config import apply_overrides, preset

        cfg = apply_overrides(preset(args.preset), _train_overrides(args))
        print(json.dumps({"train": cfg.to_dict(), "model": _asdict(cfg.model_config()),
                          "data": _asdict(cfg.data_preset())}, indent=1))
        return 0
    trainer, records = run_training(args)
    if trainer.ctx.is_main:
        if args.no_progress and records:
            _print_records(records, max(1, len(records) // 20), trainer.family.table_columns)
        print(f"fold-train: done at step {trainer.step}; metrics in "
              f"{Path(args.run_dir) / 'metrics.jsonl'}, plot {Path(args.run_dir) / 'training.png'}")
    from fold_train.distributed import teardown

    teardown(trainer.ctx)
    return 0


# -- predict ------------------------------------------------------------------------------------
def _seed_list(text: str) -> list[int]:
    """``--seeds 1,2,3``: distinct non-negative integers."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}"
                                         ) from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"expected distinct integers >= 0, got {text!r}")
    return seeds


def run_prediction(args: argparse.Namespace) -> dict | None:
    """Predict with the family whose input the command line names (``--json``: AF3; a FASTA or
    an mmCIF chain: AF2); write the mmCIF; returns the summary printed by ``predict`` (None on
    the ranks of a DAP prediction that do not write)."""
    import torch

    from fold_train.families import FAMILIES
    from fold_train.predict_dap import requested, run_distributed

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    distributed = requested(args)  # torchrun ... predict --dap N (fold_train.predict_dap)
    searched = {}
    if getattr(args, "search", None):  # fold-data msa first (fold_train.predict_search)
        from fold_train.predict_search import apply_search

        searched = apply_search(args)  # AF2: sets --msa/--templates; AF3: make_features args
        args.search_features = searched.pop("features", None)
    family = next(f for f in FAMILIES.values()
                  if any(getattr(args, a, None) for a in f.input_args))  # argparse: one is given
    if distributed:  # one input over the N ranks; None on the ranks that do not write
        return run_distributed(args, family, device)
    return {**family.predict(args, device), **searched}


def cmd_predict(args: argparse.Namespace) -> int:
    from fold_train.allocator import prefer_expandable_segments

    prefer_expandable_segments()  # before CUDA starts: long inputs fragment fixed segments
    if getattr(args, "dry_run", False):  # plan only (fold_train.predict_plan)
        import torch

        from fold_train.predict_plan import dry_run

        plan = dry_run(args, args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        print(json.dumps(plan))
        if not plan["fits"]:
            print(f"fold-train predict: {plan['name']} does not fit in "
                  f"{plan['usable_bytes']} bytes even with the smallest chunking tried "
                  f"(peak {plan['peak_bytes']} bytes)", file=sys.stderr)
        return 0 if plan["fits"] else 1
    if args.input_dir:
        return run_batch_prediction(args)
    summary = run_prediction(args)
    if summary is not None:  # DAP: the writing rank prints
        print(json.dumps(summary))
    return 0


def run_batch_prediction(args: argparse.Namespace) -> int:
    """``predict --input-dir DIR --out-dir OUT`` (:mod:`fold_train.predict_batch`): the family
    is the checkpoint's; returns the exit status (1 when an input failed). Under torchrun or
    with ``--dap``, the inputs are shared over the ranks (:mod:`fold_train.predict_batch_dap`)."""
    import torch

    from fold_train.checkpoint import CheckpointError, load_checkpoint
    from fold_train.errors import ConfigError
    from fold_train.families import FAMILIES
    from fold_train.predict_batch import find_inputs, run_batch
    from fold_train.predict_batch_dap import run_batch_distributed
    from fold_train.predict_dap import requested

    if not args.out_dir:
        raise ConfigError("--input-dir needs --out-dir (each input's outputs go to "
                          "OUT/<name>/)")
    for flag in ("out", "search", "msa", "templates", "chain"):
        if getattr(args, flag, None):
            raise ConfigError(f"--{flag} names one input's files; with --input-dir each input's "
                              "come from the directory (fold-train predict --help)")
    from fold_train.config import TrainConfig

    try:  # the family decides which files of the directory are inputs
        family_name = TrainConfig.from_dict(load_checkpoint(args.checkpoint)["config"]
                                            ).model.family
    except (KeyError, RuntimeError, ValueError, TypeError) as e:
        raise CheckpointError(args.checkpoint, f"cannot read its training config: {e}") from e
    family = FAMILIES[family_name]

    def find():
        items, failed = find_inputs(args.input_dir, family_name, chain_list=args.chains,
                                    with_templates=bool(args.template_mmcif_dir))
        if not items and not failed:
            raise ConfigError(f"{args.input_dir}: no input files (fold-train predict --help "
                              "lists what --input-dir may hold)")
        return items, failed

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if requested(args):  # torchrun / --dap: the inputs over the ranks, DAP for the large ones
        return run_batch_distributed(args, family, find, device)
    items, failed = find()
    runner = family.predict_runner(args, device)
    return run_batch(runner, items, failed, args.out_dir, seeds=args.seeds)


# -- import-weights -----------------------------------------------------------------------------
def cmd_import_weights(args: argparse.Namespace) -> int:
    from fold_train.init_from import import_weights

    print(json.dumps(import_weights(args.params, args.out, getattr(args, "source", "auto"))))
    return 0


# -- evaluate -----------------------------------------------------------------------------------
def cmd_evaluate(args: argparse.Namespace) -> int:
    from fold_train.evaluate import evaluate_pair, pair_files

    pred, true = Path(args.pred), Path(args.true)
    if pred.is_dir():
        pairs = [(p, t, c, c) for p, t, c in pair_files(pred, true)]
    else:
        pairs = [(pred, true, args.chain, args.pred_chain)]
    results = [evaluate_pair(p, t, true_chain=c, pred_chain=pc) for p, t, c, pc in pairs]
    lines = [json.dumps(r) for r in results]
    if len(results) > 1:
        keys = ("lddt_ca", "tm_score", "gdt_ts", "gdt_ha", "rmsd")
        mean = {f"mean_{k}": sum(r[k] for r in results) / len(results) for k in keys}
        lines.append(json.dumps({"n": len(results), **mean}))
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


# -- cache --------------------------------------------------------------------------------------
def cmd_cache(args: argparse.Namespace) -> int:
    from fold_data.cli import main as fold_data_main

    return fold_data_main(["cache", *args.rest])


# -- demo ---------------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    """Train ``tiny`` on the bundled chains minus one, then predict the held-back chain."""
    import os

    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        # the tiny model's ops are too small to split over threads; the loader worker uses the
        # other core of a small machine
        torch.set_num_threads(1)
    data = Path(args.data)
    run_dir = Path(args.run_dir)
    held = args.hold_out
    train_args = argparse.Namespace(
        preset="tiny", data=str(data), cache=args.cache, run_dir=str(run_dir),
        resume=False, resume_from=None, overwrite=args.overwrite, chains=None, hold_out=[held],
        device=args.device,
        no_progress=args.no_progress, cache_workers=args.cache_workers,
        overrides=[f"steps={args.steps}", *args.overrides],
    )
    print(f"== fold-train demo: train the 'tiny' AF2 on {data} (holding back {held}), then "
          f"predict {held} ==")
    trainer, records = run_training(train_args)
    print("\ntraining losses (unweighted terms; 'loss' is the AF2-weighted total) and lDDT-Ca "
          "of the training batch:")
    _print_records(records, max(1, len(records) // 15), trainer.family.table_columns)
    from fold_train.checkpoint import checkpoint_path

    ckpt = checkpoint_path(run_dir / "checkpoints", trainer.step)  # the one this run wrote
    from fold_data.dataset import discover_chains

    entry = discover_chains(data, [held])[0]  # the same files, in the same order, as training
    pred_args = argparse.Namespace(
        checkpoint=str(ckpt), fasta=None, mmcif=str(entry.mmcif_path), chain=entry.chain_id,
        msa=[str(p) for p in entry.msa_paths],
        templates=None if entry.template_hits is None else str(entry.template_hits),
        template_mmcif_dir=str(data / "mmcifs"), out=str(run_dir / "predictions" / f"{held}.cif"),
        device=args.device, no_ema=False, recycles=None, chunk_size=None, autochunk=None,
        no_cuda_graphs=False,
    )
    summary = run_prediction(pred_args)
    print(f"\nprediction of the held-back chain {held} ({summary['n_res']} residues, "
          f"{summary['n_resolved']} resolved) with the EMA weights of step {trainer.step}:")
    print(f"  lDDT-Ca {summary['lddt_ca']:.4f}   TM-score {summary['tm_score']:.4f}   GDT-TS "
          f"{summary['gdt_ts']:.4f}   GDT-HA {summary['gdt_ha']:.4f}   RMSD "
          f"{summary['rmsd']:.2f} A   mean pLDDT {summary['mean_plddt']:.1f}")
    print(f"  structure: {summary['out']} (pLDDT in the B-factor column)")
    print(f"  run directory: {run_dir} (config.json, metrics.jsonl, training.png, checkpoints/)")
    return 0


# -- parser -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from fold_data.limits import add_limit_options, parse_bytes

    parser = argparse.ArgumentParser(
        prog="fold-train",
        description="Train, run and score AlphaFold2- and AlphaFold3-style models (fold). "
                    "Training presets: af2_initial, af2_finetune (AF2 supplement Table 4), tiny "
                    "(CPU tests/demo); AlphaFold3: af3 (AF3 supplement 5.4), af3_tiny (CPU).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  fold-train train --preset tiny --data data/demo steps=50 optim.lr=5e-4\n"
               "  torchrun --nproc-per-node 8 -m fold_train.cli train --preset af2_initial "
               "--data /data/pdb\n"
               "  fold-train predict --checkpoint runs/latest/checkpoints/step_00000050.ckpt "
               "--fasta q.fasta --msa q.a3m --out q.cif\n"
               "  fold-train evaluate q.cif truth.cif --chain A\n"
               "  fold-train train --preset af3_tiny --data data/demo/af3 --ccd "
               "data/demo/af3/ccd.cif steps=80\n"
               "  torchrun --nproc-per-node 8 -m fold_train.cli train --preset af3 --data "
               "/data/complexes --dap 2   (AF3: 4 replicas x DAP 2)\n"
               "  fold-train predict --checkpoint runs/latest/checkpoints/step_00000080.ckpt "
               "--json input.json --out complex.cif",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "train", help="train a model on a data directory (or a feature cache)",
        description="Train AF2 on every chain of DATA_DIR (OpenFold layout: mmcifs/, "
                    "alignments/<pdb>_<chain>/). The features are cached ahead of time. Outputs "
                    "in the run directory: config.json, metrics.jsonl, checkpoints/, "
                    "training.png. Overrides: section.field=value with sections run "
                    "(run.steps=100, run.batch_size=2), optim (optim.lr=5e-4), parallel "
                    "(parallel.dap=2), system (system.precision=bf16), model (fold-model "
                    "fields: model.evoformer.no_blocks=2) and data (data.workers=2; fold-data "
                    "preset fields: data.n_res=128); the flat keys of earlier versions "
                    "(steps=100, precision=bf16) map to their sections. AF3 presets "
                    "train on a directory of mmCIF complexes. Several GPUs / nodes: "
                    "torchrun --nproc-per-node G -m fold_train.cli train ... (data parallel; "
                    "--dap/--bp inside each replica).")
    p.add_argument("--preset", default="tiny",
                   help="AF2: af2_initial, af2_finetune or tiny; AlphaFold3: af3 or af3_tiny "
                        "(the preset picks the model family)")
    p.add_argument("--data", help="AF2: data directory with mmcifs/ and alignments/; AF3: a "
                                  "directory of mmCIF complexes (*.cif, or mmcifs/*.cif)")
    p.add_argument("--ccd", action="append", metavar="CCD.cif",
                   help="AF3: a Chemical Component Dictionary mmCIF file (or a directory of "
                        "them) searched before biotite's CCD; repeat for more")
    p.add_argument("--cache", help="feature cache directory (default RUN_DIR/cache)")
    p.add_argument("--run-dir", default=DEFAULT_RUN_DIR, help="outputs (default runs/latest)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the run directory's latest checkpoint")
    p.add_argument("--resume-from", metavar="CKPT", help="continue from this checkpoint")
    p.add_argument("--init-from", metavar="CKPT_OR_PARAMS",
                   help="start from these weights only (fine-tuning): a fold checkpoint of any "
                        "preset with the same modules (its EMA weights), AF2's "
                        "params_model_*.npz or an OpenFold .pt; optimizer and step start fresh")
    p.add_argument("--overwrite", action="store_true",
                   help="delete an earlier run's outputs in --run-dir (config.json, "
                        "metrics.jsonl, checkpoints/, ...) first; without it (or --resume) a "
                        "run directory that holds a run is refused")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved configuration (preset + overrides) as JSON and exit")
    p.add_argument("--chains", type=_chain_list, metavar="A,B", help="only these chains")
    p.add_argument("--hold-out", type=_chain_list, metavar="A,B",
                   help="chains left out of training and evaluated with the EMA weights")
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when present; torchrun "
                                    "sets the rank's GPU)")
    p.add_argument("--cache-workers", type=int, default=2, help="featurizer processes")
    add_limit_options(p)  # size limits of the cache build (fold_data.limits)
    p.add_argument("--no-progress", action="store_true", help="no progress bar; print a table")
    p.add_argument("--dap", type=int, metavar="N",
                   help="Dynamic Axial Parallelism degree (FastFold): N ranks of each replica "
                        "share one sample, activations split along N_seq / N_res "
                        "(= parallel.dap=N); AF3: the MSA module, Pairformer and template "
                        "embedder, with data.n_token and data.n_msa multiples of N")
    p.add_argument("--bp", type=int, choices=(1, 2), metavar="{1,2}",
                   help="Branch Parallelism degree (HelixFold): 2 runs the MSA and pair branches "
                        "of each block on 2 ranks; needs model.block_order=parallel "
                        "(= parallel.bp=2). World size = DP x BP x DAP under torchrun. AF3 "
                        "presets: DP and DAP (no --bp)")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "predict", help="predict a chain (AF2) or a complex (AF3 JSON), write mmCIF",
        description="AF2 checkpoints: predict from a FASTA sequence or a chain of an mmCIF (then "
                    "also scored against it), with its MSAs (.a3m/.sto) and optional template "
                    "hits (.hhr / hmmsearch .sto). AF3 checkpoints: predict the complex of an "
                    "AlphaFold3 input JSON (--json; its MSAs and templates come from the JSON), "
                    "every chain written, ligands as HETATM. Writes mmCIF with pLDDT in the "
                    "B-factor column (AF3: per atom) and prints a JSON summary (pTM, ipTM, "
                    "ranking score). --out-dir adds every seed and sample with AlphaFold3's "
                    "confidence files; --input-dir predicts a directory of inputs with the "
                    "model loaded once.")
    p.add_argument("--checkpoint", required=True, help="a fold-train checkpoint")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--fasta", help="query FASTA (first record)")
    src.add_argument("--mmcif", help="an mmCIF whose chain --chain is the query")
    src.add_argument("--json", help="AlphaFold3 input JSON (needs an AF3 checkpoint): writes "
                                    "every chain, ligands as HETATM, per-atom pLDDT")
    src.add_argument("--input-dir", metavar="DIR",
                     help="many inputs, one model: AF3 checkpoints read DIR's AlphaFold3 JSONs "
                          "and mmCIF complexes, AF2 checkpoints its FASTA files (MSAs from "
                          "DIR/<stem>/*.a3m|*.sto) and the mmCIF chains of --chains. Needs "
                          "--out-dir; inputs run in order of size bucket; a failed input is "
                          "reported and skipped; a final table (also OUT/batch_summary.json); "
                          "exit status 1 if any failed. Under torchrun: inputs that fit one "
                          "GPU dealt to the ranks, DAP groups for the others (--dap D: of D "
                          "ranks); rank 0 writes the table")
    p.add_argument("--chain", help="chain ID in --mmcif")
    p.add_argument("--msa", nargs="*", help="MSA files of the query")
    p.add_argument("--templates", help="template hits (.hhr or hmm_output.sto)")
    p.add_argument("--template-mmcif-dir", help="directory of template <pdb>.cif files")
    p.add_argument("--search", metavar="TOML", help="search MSAs (and templates) first with "
                   "fold-data msa's config (databases, preset); when no --msa is given")
    p.add_argument("--search-out", metavar="DIR",
                   help="where --search writes (default: <output name>_search/, with only "
                        "--out-dir OUT/<input stem>_search/)")
    p.add_argument("--out", help="output mmCIF of the top-ranked prediction (default "
                                 "<name>.cif, unless --out-dir)")
    p.add_argument("--out-dir", metavar="OUT",
                   help="write every sample with its confidences, AlphaFold3's layout: "
                        "OUT/<name>/seed-S_sample-K/{model.cif,summary_confidences.json,"
                        "confidences.json}, the top-ranked one again as OUT/<name>/model.cif "
                        "(and its two JSONs), OUT/<name>/ranking_scores.csv "
                        "(docs/prediction_outputs.md)")
    p.add_argument("--seeds", type=_seed_list, metavar="S1,S2,...",
                   help="model seeds, each a prediction (AF3: --samples diffusion samples "
                        "each; AF2: the MSA sampling). Default: the AF3 JSON's modelSeeds, 0 "
                        "for AF2")
    p.add_argument("--cache", metavar="DIR",
                   help="keep each input's features in fold-data's feature cache DIR "
                        "(AF2: keyed by the bytes of the query, MSA and template-hit files; "
                        "AF3, under DIR/af3: of the JSON, every file it names and the --ccd "
                        "files): a re-run of the same inputs skips featurisation")
    p.add_argument("--chains", metavar="FILE",
                   help="--input-dir with an AF2 checkpoint: the chains of its mmCIF files, "
                        "lines '<file name> <chain>[,<chain>]'")
    p.add_argument("--recycles", type=int, help="forward passes (default: all, 1 + iterations)")
    p.add_argument("--chunk-size", type=int,
                   help="manual chunking: attention / outer-product-mean / triangle rows in "
                        "chunks of N (long chains; AF3: the trunk, the confidence Pairformer "
                        "and the diffusion transformer's pair bias)")
    p.add_argument("--autochunk", type=_memory_budget, metavar="BYTES|auto",
                   help="AutoChunk (FastFold): chunk the stacks (AF2: Evoformer, extra MSA; "
                        "AF3: template pair stack, MSA module, Pairformer, diffusion "
                        "transformer, confidence Pairformer) so that each call's estimated "
                        "activation memory fits BYTES (e.g. 2GiB, 500MB, 1e9), or 'auto': 90%% "
                        "of the device memory free at that point. Planned on each stack's first "
                        "call; the JSON summary reports the plan")
    p.add_argument("--autochunk-min-chunk", type=int, default=1, metavar="N",
                   help="smallest chunk AutoChunk may use (default 1; larger is faster but "
                        "reaches a higher memory floor)")
    p.add_argument("--memory-limit", type=parse_bytes, metavar="BYTES",
                   help="memory the prediction may use (e.g. 80GiB); default: what the device "
                        "has free. The input is sized first and refused, with the numbers and "
                        "the options, when it cannot fit")
    add_limit_options(p)  # --max-tokens / --max-atoms / --max-msa-memory (fold_data.limits)
    p.add_argument("--no-ema", action="store_true", help="use the live weights, not the EMA")
    p.add_argument("--no-cuda-graphs", action="store_true",
                   help="run eagerly on the unpadded input. Default on CUDA: pad the input to its "
                        "shape bucket (residues/tokens to a multiple of 64, of 128 above 512; "
                        "atoms of 256; MSA depth to a power of two) and replay captured graphs "
                        "of one recycling iteration (AF2) / trunk pass and sampler step (AF3); "
                        "off with --autochunk")
    p.add_argument("--device", help="cpu or cuda")
    p.add_argument("--ccd", action="append", metavar="CCD.cif",
                   help="AF3: a CCD mmCIF file (or directory) searched before biotite's CCD; "
                        "repeat for more")
    p.add_argument("--allow-outside-paths", action="store_true",
                   help="AF3: let the JSON's unpairedMsaPath/pairedMsaPath/userCCDPath/template "
                        "paths point outside the JSON's directory (refused by default)")
    p.add_argument("--dap", type=int, metavar="N",
                   help="Dynamic Axial Parallelism (FastFold): split one prediction over the N "
                        "processes of torchrun --nproc-per-node N (default under torchrun: all "
                        "of them). AF2: Evoformer, extra MSA and template stacks; AF3: "
                        "Pairformer, MSA module and template embedder, diffusion samples split "
                        "over the ranks. Chunk each rank with --chunk-size (not --autochunk); "
                        "CUDA graphs are off; rank 0 writes. With --input-dir: the DAP degree "
                        "of the inputs that do not fit one GPU (default: the smallest that "
                        "fits; 1: every input on one rank)")
    p.add_argument("--bp", type=int, choices=(1, 2), metavar="{1,2}",
                   help="AF2 with the Parallel Evoformer (model.block_order=parallel): 2 runs "
                        "the MSA and pair branches of each block on 2 ranks (HelixFold's Branch "
                        "Parallelism); world size = DAP x BP")
    p.add_argument("--no-dao", action="store_true",
                   help="with --dap: synchronous all-to-alls (no DAO overlap with compute)")
    p.add_argument("--samples", type=int, help="AF3: diffusion samples per seed (default: the "
                   "model's), every one ranked by AF3's ranking score and written with "
                   "--out-dir")
    p.add_argument("--sample-group", type=int, metavar="G",
                   help="AF3: run the diffusion network and the confidence head on G samples at "
                        "a time (less memory; the same structures as all samples at once)")
    p.add_argument("--dry-run", action="store_true",
                   help="plan, do not predict: size the input and print, as JSON, the peak "
                        "memory of each stage (trunk stacks; AF3: diffusion with the samples in "
                        "groups, confidence head) estimated on FakeTensors of the device (each op "
                        "counted as its backend there runs: fold-kernels on GPUs), for "
                        "--memory-limit (default: the device's free memory), and the "
                        "--chunk-size / --sample-group that fit")
    p.add_argument("--msa-offload", action="store_true",
                   help="AF2: keep the MSA representations in host memory while the pair "
                        "updates of each block run (when the MSA is what does not fit)")
    p.add_argument("--sampler-steps", type=int,
                   help="AF3: EDM sampler steps (default: the model's, 200 for af3)")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser(
        "import-weights", help="AF2 / OpenFold / Protenix parameters -> a fold checkpoint",
        description="Convert AlphaFold2's params_model_{1..5}[_ptm].npz, an OpenFold AF2 "
                    "checkpoint (.pt: plain, Lightning with EMA, DeepSpeed) or a Protenix AF3 "
                    "checkpoint (.pt) into a fold checkpoint that predict reads and train "
                    "--init-from starts from. Prints a JSON summary.")
    p.add_argument("params", metavar="PARAMS",
                   help="params_model_*.npz, an OpenFold .pt or a Protenix .pt")
    p.add_argument("--out", required=True, help="the fold checkpoint to write")
    p.add_argument("--from", dest="source", default="auto",
                   choices=["auto", "alphafold", "openfold", "protenix"],
                   help="the file's format (default: told by its content)")
    p.set_defaults(func=cmd_import_weights)

    p = sub.add_parser(
        "evaluate", help="score predictions against true structures",
        description="lDDT-Ca, TM-score, GDT-TS, GDT-HA and RMSD (CA) of PRED against TRUE, as "
                    "JSON lines. PRED and TRUE are mmCIF files, or directories: predictions "
                    "named <pdb>_<chain>.cif against <pdb>.cif.")
    p.add_argument("pred", metavar="PRED")
    p.add_argument("true", metavar="TRUE")
    p.add_argument("--chain", help="chain of TRUE (default: its only protein chain)")
    p.add_argument("--pred-chain", help="chain of PRED (default: its only protein chain)")
    p.add_argument("--out", help="also write the JSON lines to this file")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser(
        "cache", help="build the feature cache (fold-data cache ...)", add_help=False,
        description="Runs 'fold-data cache' with the same arguments (see fold-data cache -h).")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser(
        "demo", help="the main job: train 'tiny' on the bundled data, predict a held-back chain",
        description="Build the cache of DATA_DIR, train the tiny preset on every chain but "
                    "--hold-out, predict the held-out chain with the EMA weights and print the "
                    "losses and lDDT-Ca.")
    p.add_argument("--data", default="data/demo", help="data directory (default data/demo)")
    p.add_argument("--hold-out", default="4zey_A", help="chain to predict (default 4zey_A)")
    p.add_argument("--steps", type=int, default=150, help="training steps (default 150)")
    p.add_argument("--run-dir", default="runs/demo", help="outputs (default runs/demo)")
    p.add_argument("--cache", default=".fold_cache", help="feature cache (default .fold_cache)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier run in --run-dir (without it, a --run-dir that "
                        "holds a run is refused)")
    p.add_argument("--cache-workers", type=int, default=2, help="featurizer processes")
    p.add_argument("--device", help="cpu or cuda (default: cuda when present)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from fold_chunk import MemoryBudgetError
    from fold_data.errors import InputError

    from fold_train.checkpoint import CheckpointError
    from fold_train.config import ConfigError
    from fold_train.loop import NonFiniteError, TrainingInterrupted
    from fold_train.predict_dap import RankFailed
    from fold_train.rank_sync import RankStalled

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"fold-train {args.command}: {e}", file=sys.stderr)
        return 2
    except (InputError, CheckpointError, NonFiniteError, MemoryBudgetError, RankStalled,
            RankFailed) as e:
        print(f"fold-train {args.command}: {e}", file=sys.stderr)
        return 1
    except TrainingInterrupted as e:
        print(f"fold-train {args.command}: {e}", file=sys.stderr)
        return 128 + e.signum


if __name__ == "__main__":
    sys.exit(main())
