"""Training data: chains of the fold-data cache -> per-step samples -> batches of torch tensors.

The run reads an infinite, seeded *sample stream*: stream index ``s`` is sample
``s % n_chains`` of epoch ``s // n_chains`` in that epoch's permutation (seeded by
``(seed, epoch)``), made by the model family's ``load_sample`` (AF2: ``fold_data.af2.make_sample``)
with a seed derived from ``(seed, s)``.
With ``units`` (a :class:`WeightedUnits`: AF3's weighted chains and interfaces, supplement 2.5)
stream index ``s`` is instead one draw, with replacement, from a generator seeded by
``(seed, s)``: the entry and the chain or interface (``focus``) its crop is centred on.
So which sample a stream index is never depends on which worker made it or when. With data
parallelism rank ``r`` of ``W`` takes the stream indices ``s = r (mod W)``.

Samples are prepared in worker processes by fold-data's :class:`NonBlockingLoader` (ScaleFold's
non-blocking pipeline: a slow sample does not stall the step), which yields whichever sample is
ready first. The *data position* saved in checkpoints is therefore the set of stream indices
consumed (the lowest not yet consumed, plus the consumed ones above it), and a resumed run
prepares exactly the remaining ones. With ``strict_order=True`` (or ``workers=0``, which prepares
samples in this process) batches come in stream order, which makes a resumed run's losses equal
an uninterrupted run's.

``family`` names the model family (:mod:`fold_train.families`) that reads a cache entry and makes
its sample: AF2 ``{name: [R, ...]}`` from the chain cache, AF3 ``{name: [...]}`` (no recycling
dimension) from the complex cache.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from fold_data.cache import INDEX_NAME, CacheWarning, FeatureCache
from fold_data.errors import InputError

__all__ = ["SampleStream", "StreamItem", "WeightedUnits", "collate", "open_cache", "prepare_item",
           "stream_seed"]


def open_cache(
    data_dir: str | os.PathLike | None, cache_dir: str | os.PathLike, *,
    chains: Sequence[str] | None = None, exclude: Sequence[str] = (), workers: int = 1,
    progress: bool = False, verify: bool = True, limits=None,
) -> list[tuple[str, str]]:
    """``[(chain name, cache key)]``, sorted by name, of the usable chains.

    With ``data_dir`` the cache is built (or reused) from it with ``fold_data.cache.build_cache``
    (chains over the size ``limits``, a ``fold_data.limits.SizeLimits``, are reported and skipped);
    otherwise the cache's index is read and, with ``verify``, every entry to be used checked
    (:func:`checked_index`). ``exclude`` drops chains (a held-back chain).
    Raises :class:`InputError` if no chain is left.
    """
    if data_dir is not None:
        from fold_data.cache import build_cache

        report = build_cache(data_dir, cache_dir, workers=workers, chains=chains,
                             progress=progress, limits=limits)
        for r in report.failed:
            print(f"fold-train: skipping chain {r.name}: {(r.error or '').splitlines()[0]}")
        entries = {r.name: r.key for r in report.results if r.key is not None}
    else:
        entries = checked_index(FeatureCache(cache_dir), "chains", names=chains, verify=verify)
    out = sorted((n, k) for n, k in entries.items() if n not in set(exclude))
    if not out:
        where = data_dir if data_dir is not None else cache_dir
        raise InputError(where, None, "expected at least one usable chain (none was cached, or "
                                      "all were excluded)")
    return out


def checked_index(cache: FeatureCache, what: str, family: str = "af2",
                  names: Sequence[str] | None = None, verify: bool = True) -> dict[str, str]:
    """A cache's index checked against its files (``--cache`` alone: nothing can rebuild):
    entries the index lacks are named in a warning (not trained on: the index may leave them out
    on purpose), an indexed entry without its file is an :class:`InputError` rather than a run on
    fewer {what} than the cache claims, and every indexed entry to be used (``names``: only
    these) is read and checksummed up front (:func:`fold_train.cache_check.check_entries`), so a
    bad one is refused before training (``verify=False``: not again, on ranks whose rank 0 did)."""
    check = cache.reconcile_index()
    if check.unindexed:
        lost = sorted(check.unindexed)
        warnings.warn(f"{cache.root}: {len(lost)} cache entries are not in {INDEX_NAME} and "
                      f"are not trained on: {', '.join(lost[:10])}"
                      f"{' ...' if len(lost) > 10 else ''} (an interrupted build? build the "
                      "cache again with --data to index them)", CacheWarning, stacklevel=2)
    if check.missing:
        raise InputError(cache.root / INDEX_NAME, ", ".join(check.missing),
                         f"{len(check.missing)} indexed {what} have no entry file; rebuild the "
                         "cache from the inputs (--data)")
    from fold_train.cache_check import check_entries

    entries = check.entries
    if names is not None:
        entries = {n: k for n, k in entries.items() if n in set(names)}
    if verify:
        check_entries(cache, entries, family=family)
    return entries


@dataclass(frozen=True)
class StreamItem:
    """What a loader worker needs to make one sample (picklable)."""

    index: int  # stream index
    cache_dir: str
    name: str
    key: str
    preset: Any  # the family's data preset
    seed: int
    family: str = "af2"  # a name of fold_train.families.FAMILIES
    focus: tuple[int, ...] = ()  # AF3: asym_id of the drawn chain / interface (crop centre)


@dataclass(frozen=True)
class WeightedUnits:
    """Weighted draws of training units: ``keys`` ``{entry name: cache key}`` and a sampler
    whose ``draw(rng)`` returns a unit with ``.entry`` and ``.asyms``
    (:class:`fold_data.af3.sampling.WeightedSampler`)."""

    keys: dict[str, str]
    sampler: Any

    def draw(self, seed: int, index: int) -> tuple[str, str, tuple[int, ...]]:
        """(entry name, cache key, focus) of stream index ``index``."""
        rng = np.random.default_rng([seed, 104729, index])
        unit = self.sampler.draw(rng)
        return unit.entry, self.keys[unit.entry], tuple(int(a) for a in unit.asyms)


def stream_seed(seed: int, index: int) -> int:
    """The ``make_sample`` seed of stream index ``index``."""
    return int(np.random.SeedSequence([seed, 7919, index]).generate_state(1)[0])


def prepare_item(item: StreamItem) -> tuple[int, str, dict[str, np.ndarray]]:
    """Loader worker: read a cache entry and make its training sample (the family's)."""
    from fold_train.families import family_class

    extra = {"focus": item.focus} if item.focus else {}  # only weighted (AF3) streams
    sample = family_class(item.family).load_sample(item.cache_dir, item.name, item.key,
                                                   item.preset, item.seed, **extra)
    return item.index, item.name, sample


def collate(samples: Sequence[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """Stack samples ``{name: [R, ...]}`` into a batch ``{name: [B, R, ...]}`` of tensors."""
    if not samples:
        raise ValueError("collate needs at least one sample")
    names = samples[0].keys()
    out = {}
    for name in names:
        arrays = [s[name] for s in samples]
        shapes = {a.shape for a in arrays}
        if len(shapes) != 1:
            raise ValueError(f"feature {name!r}: samples of one batch differ in shape {shapes}")
        out[name] = torch.from_numpy(np.stack(arrays))
    return out


@dataclass
class SampleStream:
    """The seeded sample stream of one data-parallel rank, batched.

    ``chains``: ``[(name, cache key)]``; ``batch_size`` samples per batch. Iterate with
    :meth:`batches` for ``n`` batches; :meth:`state_dict` is the data position.
    """

    cache_dir: str
    chains: list[tuple[str, str]]
    preset: Any  # the family's data preset
    seed: int = 0
    batch_size: int = 1
    rank: int = 0
    world_size: int = 1
    workers: int = 1
    prefetch: int = 4
    strict_order: bool = False
    family: str = "af2"  # the model family that reads the entries and makes the samples
    units: WeightedUnits | None = None  # weighted draws instead of seeded epochs
    next_index: int = 0  # lowest stream index of this rank not yet consumed
    consumed_ahead: set[int] = field(default_factory=set)  # consumed indices above it
    _perms: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.chains:
            raise ValueError("SampleStream needs at least one chain")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")
        if self.next_index == 0:
            self.next_index = self.rank

    def item(self, index: int) -> StreamItem:
        if self.units is not None:
            name, key, focus = self.units.draw(self.seed, index)
            return StreamItem(index, str(self.cache_dir), name, key, self.preset,
                              stream_seed(self.seed, index), self.family, focus)
        n = len(self.chains)
        epoch, pos = divmod(index, n)
        if epoch not in self._perms:
            self._perms = {epoch: np.random.default_rng([self.seed, epoch]).permutation(n)}
        name, key = self.chains[int(self._perms[epoch][pos])]
        return StreamItem(index, str(self.cache_dir), name, key, self.preset,
                          stream_seed(self.seed, index), self.family)

    def _pending(self, count: int) -> list[StreamItem]:
        """The next ``count`` unconsumed stream indices of this rank, in stream order."""
        out, s = [], self.next_index
        while len(out) < count:
            if s not in self.consumed_ahead:
                out.append(self.item(s))
            s += self.world_size
        return out

    def _consume(self, index: int) -> None:
        self.consumed_ahead.add(index)
        while self.next_index in self.consumed_ahead:
            self.consumed_ahead.remove(self.next_index)
            self.next_index += self.world_size

    def _samples(self, items: list[StreamItem]) -> Iterator[tuple[int, str, dict]]:
        if self.workers == 0:
            yield from map(prepare_item, items)
            return
        from fold_data.loader import NonBlockingLoader

        names = [f"{it.name} (stream index {it.index})" for it in items]
        with NonBlockingLoader(items, prepare_item, workers=self.workers,
                               prefetch=self.prefetch, strict_order=self.strict_order,
                               names=names) as loader:
            yield from loader

    def batches(self, n: int) -> Iterator[tuple[dict[str, torch.Tensor], list[str]]]:
        """``n`` batches ``({name: [B, R, ...]}, [chain names])``; the position advances as each
        batch is yielded."""
        if n <= 0:
            return
        items = self._pending(n * self.batch_size)
        group: list[dict] = []
        names: list[str] = []
        indices: list[int] = []
        for index, name, sample in self._samples(items):
            group.append(sample)
            names.append(name)
            indices.append(index)
            if len(group) == self.batch_size:
                for i in indices:
                    self._consume(i)
                yield collate(group), names
                group, names, indices = [], [], []

    def state_dict(self) -> dict[str, Any]:
        return {"next_index": self.next_index, "consumed_ahead": sorted(self.consumed_ahead),
                "seed": self.seed, "rank": self.rank, "world_size": self.world_size,
                "chains": [n for n, _ in self.chains]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = [n for n, _ in self.chains]
        if list(state["chains"]) != mine or state["world_size"] != self.world_size \
                or state["seed"] != self.seed:
            raise ValueError(
                "the checkpoint's data position is for another stream (chains "
                f"{list(state['chains'])}, world size {state['world_size']}, seed "
                f"{state['seed']}); this run has chains {mine}, world size {self.world_size}, "
                f"seed {self.seed}")
        self.next_index = int(state["next_index"])
        self.consumed_ahead = {int(i) for i in state["consumed_ahead"]}
