"""Run inside ``unshare -rm`` by ``test_store_faults.test_real_full_disk_and_no_inodes``: mounts small
tmpfs filesystems, fills them, and runs the real ``lens`` command line against them.

Usage: ``unshare -rm python full_disk_probe.py WORKDIR REPORT.json``. For each scenario: capture
into a nearly full filesystem (expect exit 2), verify what was committed, free the space, resume,
and copy the store out of the tmpfs (which vanishes with the namespace) to ``WORKDIR/<copy>``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from tests.lens.store_harness import capture_argv  # noqa: E402


def cli(argv) -> tuple[int, str]:
    from app.commands.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main([str(a) for a in argv])
    return rc, err.getvalue()


def scenario(name: str, work: Path, index: int, options: str, fill, env: dict) -> dict:
    mnt = work / f"mnt-{index}"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "none", str(mnt)], check=True)
    ballast = fill(mnt)
    out = mnt / "store"
    os.environ.update(env)
    try:
        # past the check before the start (which refuses a store this disk cannot hold; tested in
        # test_capture_size.py): here the disk fills while the capture writes
        rc, err = cli(capture_argv(out) + ["--no-space-check"])
        manifest = out / "manifest.json"
        committed = len(json.loads(manifest.read_text())["shards"]) if manifest.exists() else 0
        verify_rc, verify_err = cli(["store", "verify", out]) if manifest.exists() else (None, "")
    finally:
        for k in env:
            os.environ.pop(k)
    shutil.rmtree(ballast)  # free the space (or the inodes)
    resume_rc, resume_err = cli(capture_argv(out, resume=True))
    copy = f"copy-{index}"
    shutil.copytree(out, work / copy)
    subprocess.run(["umount", str(mnt)], check=False)
    return {"scenario": name, "capture_rc": rc, "capture_stderr": err, "committed_shards": committed,
            "verify_rc": verify_rc, "verify_stderr": verify_err, "resume_rc": resume_rc,
            "resume_stderr": resume_err, "copy": copy}


def fill_bytes(keep: int):
    def fill(mnt: Path) -> Path:
        ballast = mnt / "ballast"
        ballast.mkdir()
        st = os.statvfs(mnt)
        with open(ballast / "fill", "wb") as fh:
            fh.write(b"\0" * max(0, st.f_bavail * st.f_frsize - keep))
        return ballast
    return fill


def fill_inodes(keep: int):
    def fill(mnt: Path) -> Path:
        ballast = mnt / "ballast"
        ballast.mkdir()
        for i in range(max(0, os.statvfs(mnt).f_favail - keep)):
            (ballast / str(i)).touch()
        return ballast
    return fill


def main() -> None:
    work, report = Path(sys.argv[1]), Path(sys.argv[2])
    import torch

    torch.set_num_threads(1)
    results = [
        scenario("disk full", work, 1, "size=4m", fill_bytes(350_000), {}),
        # with our free-space check off, the kernel's own ENOSPC (at preallocation or a write) must be
        # just as clean: no SIGBUS, exit 2, the last committed shard intact
        scenario("disk full, kernel ENOSPC", work, 2, "size=4m", fill_bytes(350_000),
                 {"LENS_STORE_SPACE_CHECK": "0"}),
        scenario("no inodes", work, 3, "size=16m,nr_inodes=400", fill_inodes(30), {"LENS_STORE_SPACE_CHECK": "0"}),
    ]
    report.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
