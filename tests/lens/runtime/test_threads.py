"""lens.runtime.threads: cores from affinity and the cgroup CPU quota (fake cgroup files), pools sized once,
``serial`` re-entrant and restoring the configured count."""

import threading

import pytest
import torch

from lens.runtime import threads


def _cg(tmp_path, files: dict, proc: str = "0::/\n"):
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    root.mkdir(exist_ok=True)
    pc = tmp_path / "proc_cgroup"
    pc.write_text(proc)
    return dict(cgroup_root=root, proc_cgroup=pc)


@pytest.mark.parametrize("files, proc, affinity, expected", [
    ({"cpu.max": "200000 100000\n"}, "0::/\n", 16, 2),                 # v2 quota of 2 CPUs
    ({"cpu.max": "150000 100000\n"}, "0::/\n", 16, 2),                 # 1.5 CPUs: rounded up
    ({"cpu.max": "50000 100000\n"}, "0::/\n", 16, 1),                  # half a CPU: at least 1
    ({"cpu.max": "max 100000\n"}, "0::/\n", 6, 6),                     # no quota: the affinity set
    ({"cpu.max": "800000 100000\n"}, "0::/\n", 3, 3),                  # quota above affinity: affinity
    ({"app/cpu.max": "300000 100000\n", "cpu.max": "max 100000\n"}, "0::/app\n", 16, 3),  # own v2 group
    ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, "", 16, 4),  # v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, "", 8, 8),    # v1 unlimited
    ({}, "", 5, 5),                                                     # no cgroup files at all
    ({"cpu.max": "garbage\n"}, "0::/\n", 4, 4),                         # unreadable: ignored
])
def test_available_cores_reads_fake_cgroup_files(tmp_path, files, proc, affinity, expected):
    assert threads.available_cores(affinity=affinity, **_cg(tmp_path, files, proc)) == expected


def test_available_cores_on_this_machine_is_within_affinity():
    import os

    n = threads.available_cores()
    assert 1 <= n <= len(os.sched_getaffinity(0))


def test_configure_once_and_serial_restores(monkeypatch):
    n = threads.configure_threads()
    assert threads.configure_threads(n + 3) == n  # later calls change nothing
    assert torch.get_num_threads() == n
    with threads.serial():
        assert torch.get_num_threads() == 1
        with threads.serial("cpu"):  # nested: still one thread, no read of a mid-way count
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == n

    errors = []

    def worker():
        try:
            for _ in range(50):
                with threads.serial():
                    torch.linalg.eigvalsh(torch.eye(8, dtype=torch.float64))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    ts = [threading.Thread(target=worker) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors and torch.get_num_threads() == n  # concurrent uses restore the configured count


@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5"])
def test_a_bad_thread_count_in_the_environment_is_said_not_ignored(value):
    """LENS_NUM_THREADS that is no positive whole number: every core available, and a warning naming it
    (in a fresh interpreter: this process's pools are sized once)."""
    import os
    import subprocess
    import sys

    code = "from lens.runtime import threads; print(threads.configure_threads(), threads.available_cores())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "LENS_NUM_THREADS": value})
    used, cores = out.stdout.split()
    assert out.returncode == 0 and used == cores
    assert f"LENS_NUM_THREADS={value!r} is not a positive whole number" in out.stderr
