"""Wall seconds per stage of a prediction, for the summary ``fold-train predict`` prints.

A long input's time is spent in different places (the model, the confidence terms computed from
the coordinates, writing the files, loading the checkpoint); the summary's ``"seconds"`` says
where, e.g. ``{"load": 21.4, "features": 3.2, "model": 301.7, "confidence": 2.1, "write": 1.0}``.
The model stage ends when its outputs are on the host, so it includes the GPU's work.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

__all__ = ["StageTimer"]


class StageTimer:
    """``with timer("model"): ...`` adds the block's wall seconds to the stage; :meth:`take`
    returns the stages so far (rounded to ms) and starts over, so a runner that predicts many
    inputs reports each one's own (its first also the checkpoint's ``load``)."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[stage] = self._seconds.get(stage, 0.0) + time.perf_counter() - t0

    def take(self) -> dict[str, float]:
        out = {k: round(v, 3) for k, v in self._seconds.items()}
        self._seconds = {}
        return out
