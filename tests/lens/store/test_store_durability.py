"""A store survives a power cut after a finished capture (issue #39): the folder ``--out`` names (and any parent
the capture creates) is made durable in its parent directory when it is created, and the parent is fsynced again
at the final commit — as SQLite syncs its journal's directory. Without it the kernel may keep the new folder's
name only in memory, and a power cut loses the whole store.

Watched twice: in process, with ``os.fsync`` recording the path of every descriptor it syncs (so the behaviour is
tested on every Linux machine), and in a real ``lens capture`` process under ``strace`` (its own ``mkdir``,
``fsync`` and ``rename`` system calls; skipped with the reason where strace is missing or may not trace)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lens

ROOT = Path(__file__).resolve().parents[3]
KW = dict(corpus="lee", max_tokens=128, seq_len=32, batch_size=2, shard_tokens=64, sites=["resid_post"],
          progress=False)
PROC_FD = Path("/proc/self/fd")


def _watch(monkeypatch) -> list[tuple[str, str]]:
    """Every ``os.fsync`` (the path its descriptor names) and ``os.replace`` (the destination), in order."""
    events: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def watched_fsync(fd):
        events.append(("fsync", os.readlink(PROC_FD / str(fd))))
        return fsync(fd)

    def watched_replace(src, dst, *a, **kw):
        out = replace(src, dst, *a, **kw)
        events.append(("replace", str(Path(dst).absolute())))
        return out

    monkeypatch.setattr(os, "fsync", watched_fsync)
    monkeypatch.setattr(os, "replace", watched_replace)
    return events


def _assert_durable(events, store: Path, created: list[Path]) -> None:
    """Each created folder's parent fsynced before the first manifest commit; after the last commit (the
    complete manifest) the store folder and then its parent fsynced."""
    manifest = str(store / "manifest.json")
    commits = [i for i, e in enumerate(events) if e == ("replace", manifest)]
    assert commits, events
    for d in created:
        synced = [i for i, e in enumerate(events) if e == ("fsync", str(d.parent))]
        assert synced and synced[0] < commits[0], (d, events[:commits[0] + 1])
    after = [e for e in events[commits[-1] + 1:] if e[0] == "fsync"]
    assert ("fsync", str(store)) in after and ("fsync", str(store.parent)) in after, after
    assert after.index(("fsync", str(store.parent))) > after.index(("fsync", str(store))), after


@pytest.mark.skipif(not PROC_FD.is_dir(), reason="no /proc/self/fd to name a synced descriptor's path")
def test_a_capture_fsyncs_the_parent_of_every_folder_it_creates_and_at_the_end(tiny_llama, tmp_path, monkeypatch):
    base = tmp_path.resolve()
    store = base / "runs" / "new" / "store"  # two parents the capture creates as well
    events = _watch(monkeypatch)
    lens.capture(tiny_llama, out=store, **KW)
    _assert_durable(events, store, [base / "runs", base / "runs" / "new", store])
    # a store folder that already exists (made by the user): the final commit still syncs its parent
    store2 = base / "made" / "store"
    store2.mkdir(parents=True)
    events.clear()
    lens.capture(tiny_llama, out=store2, **KW)
    _assert_durable(events, store2, [])


@pytest.mark.skipif(not PROC_FD.is_dir(), reason="no /proc/self/fd to name a synced descriptor's path")
def test_a_merge_fsyncs_the_parent_too(tiny_llama, tmp_path, monkeypatch):
    from lens.store.parts import merge_stores

    base = tmp_path.resolve()
    for i in (1, 2):
        lens.capture(tiny_llama, out=base / f"p{i}", part=f"{i}/2", **KW)
    events = _watch(monkeypatch)
    merge_stores([base / "p1", base / "p2"], base / "m" / "merged")
    _assert_durable(events, base / "m" / "merged", [base / "m", base / "m" / "merged"])


def _strace_available() -> str | None:
    """Why strace cannot watch a process here (None: it can)."""
    exe = shutil.which("strace")
    if exe is None:
        return "strace is not installed (scripts/system_deps.sh installs it)"
    probe = subprocess.run([exe, "-f", "-e", "trace=fsync", "true"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return f"strace cannot trace here: {probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else probe.returncode}"
    return None


def test_a_real_capture_under_strace_fsyncs_the_parent_after_mkdir_and_the_final_commit(tmp_path):
    why = _strace_available()
    if why:
        pytest.skip(why)
    base = tmp_path.resolve()
    store = base / "out" / "store"
    trace = base / "trace.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LENS_DEBUG": ""}
    proc = subprocess.run(
        ["strace", "-f", "-y", "-qq", "-s", "512", "-o", str(trace),
         "-e", "trace=mkdir,mkdirat,fsync,fdatasync,rename,renameat,renameat2",
         sys.executable, "-m", "lens", "capture", "tiny-llama", "--corpus", "lee", "--max-tokens", "128",
         "--seq-len", "32", "--sites", "resid_post", "--out", str(store), "--quiet"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = trace.read_text().splitlines()

    def first(pattern, start=0):
        rx = re.compile(pattern)
        return next((i for i in range(start, len(lines)) if rx.search(lines[i])), None)

    def fsync_of(folder: Path) -> str:
        return rf"\bfsync\(\d+<{re.escape(str(folder))}>\)\s+= 0"

    made = first(rf'mkdir(at)?\((AT_FDCWD<[^>]*>, )?"{re.escape(str(store))}", ')
    assert made is not None, "no mkdir of the store folder in the trace"
    assert first(fsync_of(store.parent), made) is not None, "the parent was not fsynced after the mkdir"
    final = [i for i, l in enumerate(lines) if re.search(r"rename(at2?)?\(", l)
             and f"{store}/manifest.json.tmp" in l and l.rstrip().endswith("= 0")]
    assert final, "no manifest commit in the trace"
    assert first(fsync_of(store), final[-1]) is not None, "the store folder was not fsynced after the final commit"
    assert first(fsync_of(store.parent), final[-1]) is not None, \
        "the store's parent was not fsynced after the final commit"
