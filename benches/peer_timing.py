"""The timing both peer scripts use, so that a peer is timed as `torsh-backend bench` times ours."""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

# The most calls in one repeat.
MAX_K = 1 << 20


def measure(run: Callable[[], object], repeats: int, target: float) -> float:
    """Seconds per call: a warm-up call, then the median of `repeats` repeats of k back-to-back
    calls, k grown until one repeat lasts at least `target` seconds, as ours."""
    def batch(k):
        start = time.perf_counter()
        for _ in range(k):
            run()
        return time.perf_counter() - start

    batch(1)
    k, per = 1, []
    while True:
        t = batch(k)
        if t >= target or k >= MAX_K:
            per.append(t / k)
            break
        grow = math.ceil(target * 1.2 / t) if t > 0 else 100
        k = int(min(k * min(max(grow, 2), 100), MAX_K))
    while len(per) < repeats:
        per.append(batch(k) / k)
    return statistics.median(per)
