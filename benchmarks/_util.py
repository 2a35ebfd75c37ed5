"""Small timing helpers shared by the benchmarks (ratios measured side by side in one run)."""

from __future__ import annotations

import statistics
import time


def median_time(fn, repeats: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved(fns: dict, repeats: int = 5, warmup: int = 1) -> dict:
    """Median seconds per callable, running them round-robin so drift hits all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


class PeakRSS:
    """Peak resident memory above the starting point, sampled by a background thread.

    ``with PeakRSS() as mem: ...`` then ``mem.delta_mb``.
    """

    def __init__(self, interval: float = 0.002):
        import psutil

        self.interval, self.proc = interval, psutil.Process()

    def __enter__(self):
        import threading

        self.start = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def delta_mb(self) -> float:
        return (self.peak - self.start) / 2**20
