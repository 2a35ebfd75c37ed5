"""Run inside ``unshare -rm`` by ``test_bad_inputs.test_full_and_read_only_filesystems``: mounts small
tmpfs filesystems (full, or remounted read-only), runs the real ``lens`` command line against them as a
subprocess, and records for each scenario its exit code, its stderr, every file left under the mount
and the bytes of the finished results that were there before.

Usage: ``unshare -rm python bad_env_probe.py WORKDIR REPORT.json``. The tmpfs vanish with the
namespace, so everything the test checks is written to REPORT.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

SMALL = ["--model", "tiny-llama", "--corpus", "lee", "--max-tokens", "200", "--quiet"]


def lens(*argv) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-m", "app", *map(str, argv)], capture_output=True, text=True,
                         timeout=500)
    return out.returncode, out.stderr


def digests(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def mount(mnt: Path, size: str) -> None:
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "none", str(mnt)], check=True)


def fill(mnt: Path, keep: int) -> None:
    st = os.statvfs(mnt)
    with open(mnt / "ballast", "wb") as fh:
        fh.write(b"\0" * max(0, st.f_bavail * st.f_frsize - keep))


def scenario(name: str, mnt: Path, argv, finished: Path | None = None) -> dict:
    before = digests(finished) if finished else {}
    rc, err = lens(*argv)
    files = sorted(str(p.relative_to(mnt)) for p in mnt.rglob("*") if p.is_file() and p.name != "ballast")
    return {"scenario": name, "rc": rc, "stderr": err, "files": files,
            "finished_before": before, "finished_after": digests(finished) if finished else {}}


def main() -> None:
    work, report = Path(sys.argv[1]), Path(sys.argv[2])
    from tests.synthetic_runs import write_synthetic_run

    results = []
    # a full disk: the main job's report (plotly inlined, ~4 MB) does not fit; the finished results of
    # an earlier run in the same folder stay as they were
    mnt = work / "full"
    mount(mnt, "2m")
    write_synthetic_run(mnt / "job" / "earlier", n_layers=4, n_tokens=50, studies=["linearity"])
    fill(mnt, 64 << 10)
    results.append(scenario("report, disk full", mnt, ["report", mnt / "job"], mnt / "job" / "earlier"))
    results.append(scenario("study, disk full", mnt, ["study", "linearity", *SMALL, "--out", mnt / "one"]))
    (mnt / "ballast").unlink()
    fill(mnt, 600 << 10)  # room for the shared store (~250 kB), not for a figure with plotly inlined
    results.append(scenario("study all, disk full", mnt, ["study", "all", "--only", "linearity", "--jobs", "1",
                                                         *SMALL, "--out", mnt / "job"], mnt / "job" / "earlier"))
    # a read-only filesystem: nothing can be written, what is there stays
    mnt = work / "ro"
    mount(mnt, "8m")
    write_synthetic_run(mnt / "job" / "earlier", n_layers=4, n_tokens=50, studies=["linearity"])
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
    results.append(scenario("report, read-only", mnt, ["report", mnt / "job"], mnt / "job" / "earlier"))
    results.append(scenario("study all, read-only", mnt, ["study", "all", "--only", "linearity", *SMALL,
                                                         "--out", mnt / "job"], mnt / "job" / "earlier"))
    results.append(scenario("study, read-only", mnt, ["study", "linearity", *SMALL, "--out", mnt / "new"]))
    report.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
