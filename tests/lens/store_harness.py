"""Shared by the store fault and corruption tests: run the real ``lens`` command line in a forked
child (a real process that can be killed with SIGKILL) and compare stores byte for byte.

A fork starts in milliseconds with torch, transformers and the tiny models already loaded, where a
fresh interpreter takes seconds on these machines; that is what makes dozens of real kills cheap.
The child runs ``app.commands.cli.main`` exactly as the console script does, except that
``lens.load_model`` hands back the model the parent already built (the same object the alias loads).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A small capture: 600 tokens in 32-token windows, 2 windows per shard -> about ten shards, each
# with a per-layer site and a single-position site.
CAPTURE_ARGS = ["--corpus", "lee", "--max-tokens", "600", "--seq-len", "32", "--batch-size", "2",
                "--shard-tokens", "64", "--sites", "resid_post,embed", "--quiet"]


@dataclass
class Child:
    pid: int
    err: Path
    started: float

    def wait(self, timeout: float = 120.0) -> "Outcome":
        deadline = time.time() + timeout
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                text = self.err.read_text(errors="replace") if self.err.exists() else ""
                self.err.unlink(missing_ok=True)
                return Outcome(status, text, time.time() - self.started)
            if time.time() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                raise TimeoutError(f"child {self.pid} did not finish in {timeout} s")
            time.sleep(0.005)

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class Outcome:
    status: int
    stderr: str
    seconds: float

    @property
    def killed(self) -> bool:
        return os.WIFSIGNALED(self.status) and os.WTERMSIG(self.status) == signal.SIGKILL

    @property
    def rc(self) -> int | None:
        return os.WEXITSTATUS(self.status) if os.WIFEXITED(self.status) else None

    def error_line(self) -> str:
        """The one ``lens: error:`` line of a run that exited 2 (asserts there is exactly one)."""
        lines = [l for l in self.stderr.splitlines() if l.strip()]
        errors = [l for l in lines if l.startswith("lens: error:")]
        assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in self.stderr, self.stderr
        return errors[0]


def fork_cli(argv: list, models: dict, env: dict | None = None, stdout: Path | None = None) -> Child:
    """Start ``lens ARGV`` in a forked child; ``models`` maps a model name to its loaded model; its
    standard output goes to the file ``stdout`` (default: nowhere)."""
    err = Path(tempfile.gettempdir()) / f"lens-child-{os.getpid()}-{time.time_ns()}.err"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child: never returns
        rc = 1
        try:
            fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 2)
            null = os.open(stdout or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(null, 1)
            sys.stderr = open(2, "w", closefd=False)
            sys.stdout = open(1, "w", closefd=False)
            os.environ.pop("LENS_STORE_FAULT", None)
            os.environ.pop("LENS_DEBUG_BATCH_DELAY", None)
            os.environ.update(env or {})
            import torch

            torch.set_num_threads(1)
            # and keep it so: the CLI sizes the pools at start-up (lens.runtime.threads), and an OpenMP team of more
            # than one thread in a child forked after the parent ran one deadlocks (GNU libgomp)
            os.environ["LENS_NUM_THREADS"] = "1"
            import lens
            from lens.store import faults
            from app.commands.cli import main

            faults.reset()
            lens.load_model = lambda spec, *a, **k: models[str(spec)]
            rc = main([str(a) for a in argv])
        except BaseException as exc:  # noqa: BLE001 - report, then leave with the CLI's internal-error code
            print(f"child crashed: {type(exc).__name__}: {exc}", file=sys.stderr)
            rc = 1
        finally:
            try:
                sys.stderr.flush()
                sys.stdout.flush()
            finally:
                os._exit(rc if isinstance(rc, int) else 1)
    return Child(pid, err, time.time())


def run_cli(argv: list, models: dict, env: dict | None = None, timeout: float = 120.0) -> Outcome:
    return fork_cli(argv, models, env).wait(timeout)


def capture_argv(out: Path, model: str = "tiny-llama", resume: bool = False) -> list:
    return ["capture", model, *CAPTURE_ARGS, "--out", str(out)] + (["--resume"] if resume else [])


def store_files(root: Path) -> dict:
    """Relative path -> bytes of every file of a store (the lock file excluded: it belongs to a run)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(Path(root).rglob("*"))
            if p.is_file() and p.name != "writer.lock"}


def assert_same_store(got: Path, ref: Path) -> None:
    """Byte-identical shards and file list; the manifest equal except its creation time (and so its seal)."""
    a, b = store_files(got), store_files(ref)
    assert sorted(a) == sorted(b), (sorted(set(a) ^ set(b)))
    for name in a:
        if name == "manifest.json":
            ma, mb = json.loads(a[name]), json.loads(b[name])
            for m in (ma, mb):
                m.pop("created"), m.pop("manifest_sha256")
            assert ma == mb
        else:
            assert a[name] == b[name], name


def drop_merge_fidelity(merged: dict, single: dict) -> list:
    """Take out of a merged store's manifest and a single capture's the fidelity fields only a merge fills
    (lens.store.fidelity.merged_record: ``parts``, every part's record, and ``part``, the one the record is — part
    1's when all are ok); returns the parts' records."""
    parts = merged["fidelity"].pop("parts")
    assert merged["fidelity"].pop("part") == parts[0]["part"] == f"1/{len(parts)}", [p["part"] for p in parts]
    single["fidelity"].pop("parts"), single["fidelity"].pop("part")
    return parts


def unshare_works() -> bool:
    """Whether a tmpfs can be mounted in a user + mount namespace here (the full / read-only disk tests)."""
    if not shutil.which("unshare"):
        return False
    try:
        probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k none /mnt"],
                               capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0
