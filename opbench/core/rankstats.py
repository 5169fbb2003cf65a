"""Per-rank statistics of a collective: who did the job wait for, and how far apart were the ranks.

A collective finishes when its slowest rank does, so the average over ranks (what nccl-tests prints) hides a
straggler. From every rank's per-iteration times (ranks × iterations) this computes, as documented in
docs/cluster.md ("Per-rank collective statistics"):

- ``slowest_p50`` / ``slowest_p95``: the median and 95th percentile over iterations of the slowest rank's time
  in that iteration — what the job actually waited for;
- ``slowest_rank``: the rank that was slowest in the most iterations, and ``slowest_share`` how often;
- ``spread``: the 95th percentile over ranks of each rank's median time minus the median over ranks — how far the
  slow tail of ranks sits above the typical rank.

No torch; numpy only, so the report and the verdict code use it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RankStats:
    slowest_p50: float
    slowest_p95: float
    slowest_rank: int
    slowest_share: float  # fraction of iterations in which ``slowest_rank`` was the slowest
    rank_median: float  # median over ranks of each rank's median time
    spread: float  # p95 over ranks of each rank's median time − rank_median

    def as_row(self, scale: float = 1e6, unit: str = "us") -> dict[str, float | int]:
        """Columns of a CSV row, times scaled (default: seconds to microseconds)."""
        return {
            f"slowest_p50_{unit}": self.slowest_p50 * scale,
            f"slowest_p95_{unit}": self.slowest_p95 * scale,
            "slowest_rank": self.slowest_rank,
            "slowest_share": self.slowest_share,
            f"rank_spread_{unit}": self.spread * scale,
        }


def rank_stats(times: Sequence[Sequence[float]] | np.ndarray, ranks: Sequence[int] | None = None) -> RankStats:
    """``times[i][j]``: member i's time in iteration j (seconds); ``ranks[i]`` names member i (default: i)."""
    arr = np.asarray(times, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"need a ranks × iterations array, got shape {arr.shape}")
    names = list(range(arr.shape[0])) if ranks is None else list(ranks)
    if len(names) != arr.shape[0]:
        raise ValueError(f"{len(names)} rank names for {arr.shape[0]} rows")
    slowest = arr.max(axis=0)
    who = np.bincount(arr.argmax(axis=0), minlength=arr.shape[0])  # ties go to the lowest member, as argmax does
    top = int(who.argmax())
    per_rank = np.median(arr, axis=1)
    mid = float(np.median(per_rank))
    return RankStats(
        slowest_p50=float(np.median(slowest)),
        slowest_p95=float(np.percentile(slowest, 95)),
        slowest_rank=int(names[top]),
        slowest_share=float(who[top] / arr.shape[1]),
        rank_median=mid,
        spread=float(np.percentile(per_rank, 95)) - mid,
    )
