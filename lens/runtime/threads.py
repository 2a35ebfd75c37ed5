"""Thread pools: sized once per process from the cores this process may actually use.

Every numeric library brings its own pool: torch (OpenMP intra-op + an inter-op pool), the BLAS /
LAPACK behind numpy and scipy (OpenBLAS or MKL), scikit-learn's OpenMP kernels, numba. Each sizes
itself from the machine's CPU count, which in a container or under ``taskset`` is larger than the
cores the process may use, and several pools running at once each spawn that many threads. On a
shared 2-core machine the result is oversubscription: OpenMP workers spin-wait for cores that other
workers hold (a 4000 × 576 ``svdvals`` measured 29 s with two contended threads against 1.4 s with
one).

So: :func:`available_cores` counts what the scheduler will really give us (CPU affinity and the
cgroup CPU quota, v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``), and :func:`configure_threads` sizes
every pool to it once per process — from the ``lens`` command line at start-up and, lazily, from the
first heavy call in ``geometry`` / ``probes`` (a no-op after the first). Library code then never
resizes pools per call; the inter-op pool is one thread, so a torch op never runs inside another
pool's worker (no nested pools). ``LENS_NUM_THREADS`` overrides the count.

The one exception is :func:`serial`: small LAPACK factorisations (``eigh``/``eigvalsh``/``svd`` of
d_model-sized matrices) run on one thread, because multi-threaded LAPACK on a busy machine spends
its time in barriers (measured side by side under load: ``eigvalsh`` of 576 × 576, 3.9 s on two
threads against 0.13 s on one; passive OpenMP waiting fixes ``eigvalsh`` but makes ``svdvals``
worse). ``serial`` is re-entrant and thread-safe: nested or concurrent uses drop to one thread once
and restore the configured count when the last one leaves, never a count read mid-way.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from contextlib import contextmanager
from pathlib import Path

from threadpoolctl import ThreadpoolController, threadpool_limits

__all__ = ["available_cores", "configure_threads", "configured_threads", "serial", "child_environment"]

log = logging.getLogger(__name__)

_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "NUMBA_NUM_THREADS")
_lock = threading.Lock()
_configured: int | None = None
_serial_depth = 0
_serial_restore = 1


def _affinity_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _own_cgroup_v2_path(proc_cgroup: Path) -> str | None:
    try:
        for line in proc_cgroup.read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].strip() or "/"
    except OSError:
        pass
    return None


def _cgroup_quota(root: Path, proc_cgroup: Path) -> float | None:
    """CPUs allowed by the cgroup CPU quota (quota / period), or None when unlimited or unknown."""
    candidates = []
    own = _own_cgroup_v2_path(proc_cgroup)
    if own and own != "/":  # v2: the process's own group first (no cgroup namespace), then the root
        candidates.append(root / own.lstrip("/") / "cpu.max")
    candidates.append(root / "cpu.max")
    for path in candidates:
        try:
            quota, period = path.read_text().split()[:2]
        except (OSError, ValueError):
            continue
        if quota == "max":
            return None
        try:
            q, p = float(quota), float(period)
        except ValueError:
            return None
        return q / p if q > 0 and p > 0 else None
    for folder in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):  # v1
        try:
            q = float((root / folder / "cpu.cfs_quota_us").read_text().strip())
            p = float((root / folder / "cpu.cfs_period_us").read_text().strip())
        except (OSError, ValueError):
            continue
        return q / p if q > 0 and p > 0 else None
    return None


def available_cores(*, cgroup_root: str | os.PathLike = "/sys/fs/cgroup",
                    proc_cgroup: str | os.PathLike = "/proc/self/cgroup",
                    affinity: int | None = None) -> int:
    """Cores this process can use: the CPU affinity set, capped by the cgroup CPU quota (rounded up,
    at least 1). ``cgroup_root``, ``proc_cgroup`` and ``affinity`` exist for tests."""
    n = _affinity_count() if affinity is None else int(affinity)
    quota = _cgroup_quota(Path(cgroup_root), Path(proc_cgroup))
    if quota is not None:
        n = min(n, math.ceil(quota - 1e-9))
    return max(1, n)


def child_environment(n: int) -> dict[str, str]:
    """The environment variables a child process needs for every pool to start at ``n`` threads (set
    before its first import of torch / numpy: OpenMP reads them when it loads)."""
    return {var: str(int(n)) for var in ("LENS_NUM_THREADS",) + _ENV_VARS}


def _torch():
    """torch, imported on first use: after :func:`configure_threads` has set the pools' environment variables
    (OpenMP reads ``OMP_NUM_THREADS`` when it loads), never when this module is imported."""
    import torch  # lazy: torch (its OpenMP) must load after configure_threads sets OMP_NUM_THREADS

    return torch


def configured_threads() -> int | None:
    """The thread count set by :func:`configure_threads`, or None before it ran."""
    return _configured


def configure_threads(n: int | None = None, *, force: bool = False) -> int:
    """Size torch's, the BLAS libraries' and OpenMP's pools to ``n`` threads, once per process.

    ``n`` defaults to ``LENS_NUM_THREADS`` or :func:`available_cores`. Later calls return the
    configured count and change nothing unless ``force=True``. Environment variables are set only
    where the user has not set them, for libraries loaded later and for child processes.
    """
    global _configured
    with _lock:
        if _configured is not None and not force:
            return _configured
        if n is None:
            env = os.environ.get("LENS_NUM_THREADS", "").strip()
            n = int(env) if env.isdigit() and int(env) > 0 else available_cores()
            if env and not (env.isdigit() and int(env) > 0):
                log.warning("LENS_NUM_THREADS=%r is not a positive whole number: using the %d cores available", env, n)
        n = max(1, int(n))
        for var in _ENV_VARS:
            if force:
                os.environ[var] = str(n)
            else:
                os.environ.setdefault(var, str(n))
        torch = _torch()  # after the environment variables above are set
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
        try:  # only possible before the inter-op pool first runs; one thread: no pool inside a pool
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
        try:  # BLAS / OpenMP libraries already loaded (numpy's OpenBLAS, scikit-learn's OpenMP)
            threadpool_limits(limits=n)
        except Exception as exc:  # a library threadpoolctl cannot drive
            log.debug("threadpoolctl could not size the BLAS pools: %s", exc)
        _configured = n
        log.info("thread pools sized to %d (of %d CPUs on the machine)", n, os.cpu_count() or 0)
        return n


@contextmanager
def serial(device=None):
    """Run the enclosed small LAPACK / BLAS calls on one thread (torch's pool and the BLAS pools).

    A no-op for a non-CPU ``device``. Re-entrant and thread-safe (see the module docstring)."""
    global _serial_depth, _serial_restore
    if device is not None:
        if _torch().device(device).type != "cpu":
            yield
            return
    configure_threads()
    with _lock:
        _serial_depth += 1
        if _serial_depth == 1:
            _serial_restore = _configured or _torch().get_num_threads()
            _torch().set_num_threads(1)
            _blas_limit(1)
    try:
        yield
    finally:
        with _lock:
            _serial_depth -= 1
            if _serial_depth == 0:
                _torch().set_num_threads(_serial_restore)
                _blas_limit(_serial_restore)


_controller = None


def _blas_limit(n: int) -> None:
    """Resize the BLAS pools of numpy / scipy (threadpoolctl; its library scan is done once)."""
    global _controller
    try:
        if _controller is None:
            _controller = ThreadpoolController()
        for lib in _controller.select(user_api="blas").lib_controllers:
            lib.set_num_threads(n)
    except Exception as exc:
        log.debug("threadpoolctl could not resize the BLAS pools: %s", exc)
