"""What the benchmarks share: side-by-side timing (ratios measured in one run), peak memory, running a child
process to its end with its own CPU seconds and peak RSS, the growth exponent of a cost, and the random Llama
folder the scale benchmarks decode through. A benchmark imports this module and no other benchmark.

Scripts run as ``python benchmarks/X.py`` put the repository on ``sys.path`` (``ROOT``) and then
``from benchmarks.common import ...``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent


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
    return timed_rounds(fns, repeats, warmup)[0]


def timed_rounds(fns: dict, repeats: int, warmup: int = 1) -> tuple[dict, dict]:
    """Median wall and process-CPU seconds per callable, run round-robin after ``warmup`` calls each."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    wall, cpu = {k: [] for k in fns}, {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    return ({k: statistics.median(v) for k, v in wall.items()}, {k: statistics.median(v) for k, v in cpu.items()})


class PeakRSS:
    """Peak resident memory above the starting point, sampled by a background thread.

    ``with PeakRSS() as mem: ...`` then ``mem.delta_mb``.
    """

    def __init__(self, interval: float = 0.002):
        self.interval, self.proc = interval, psutil.Process()

    def __enter__(self):
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


def fit_exponent(ns, ts) -> float | None:
    """The least-squares slope of log t on log n over the points with a positive t (``None`` with fewer than two
    distinct n): the exponent k of t ≈ c · n^k."""
    pts = [(math.log(n), math.log(t)) for n, t in zip(ns, ts) if t and t > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    var = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / var if var else None


def measure(cmd: list, timeout: float) -> dict:
    """Run ``cmd`` (``PYTHONPATH`` = the repository) to its end: its wall and CPU seconds, peak RSS
    (bytes, from ``wait4``) and the ``seconds`` it printed as JSON on its last line (if any; the whole line as
    ``said``); or ``error`` (its last stderr line, or the timeout)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = _Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": f"timeout {timeout:.0f} s", "wall": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"error": (stderr.strip().splitlines() or ["?"])[-1][:200], "wall": wall}
    try:
        said = json.loads(stdout.strip().splitlines()[-1])
        seconds = said["seconds"]
    except (IndexError, ValueError, KeyError, TypeError):
        said, seconds = {}, wall
    return {"seconds": seconds, "wall": wall, "rss": proc.maxrss, "cpu": proc.cpu, "said": said}


class _Popen(subprocess.Popen):
    """A Popen that keeps the child's own resource usage (``maxrss`` in bytes) from ``wait4``."""

    maxrss = None
    cpu = None

    def _try_wait(self, wait_flags):
        try:
            pid, sts, ru = os.wait4(self.pid, wait_flags)
        except ChildProcessError:
            pid, sts = self.pid, 0
        else:
            if pid == self.pid:
                self.maxrss = ru.ru_maxrss * 1024
                self.cpu = ru.ru_utime + ru.ru_stime
        return pid, sts


def write_model(folder: Path, d: int, layers: int, vocab: int, mlp: int, heads: int, kv_heads: int,
                seed: int = 0) -> int:
    """A random Llama of this shape saved as a model folder a researcher would bring; its parameter count."""
    import torch  # noqa: PLC0415 - only the scale benchmarks build a model; the timing helpers stay light
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    from lens.model.packaged import smollm2_tokenizer  # noqa: PLC0415

    tok = smollm2_tokenizer()
    if vocab > len(tok):
        tok.add_tokens([f"<|reserved_{i}|>" for i in range(vocab - len(tok))], special_tokens=True)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=mlp, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())
