"""How long the ``lens`` command takes to answer ``--help``: ``lens --help`` beside ``lens capture --help``, and
beside what every command paid before the parser was built from cheap modules (``python -c "import lens"``:
torch and transformers).

Goal: ``lens --help`` < 1 s. Each is a fresh process (the interpreter's start included, as a user's shell sees
it), run round-robin ``--repeat`` times so that load drifting during the run hits all alike; medians and the
ratios to ``lens --help`` are printed with the load average.

    .venv/bin/python benchmarks/cli.py [--repeat 5] [--before /path/to/an/older/checkout]

``--before DIR`` adds ``lens --help`` run from another checkout (e.g. a worktree of an older commit) for a
before/after figure on the same machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.common import interleaved  # noqa: E402

GOAL_S = 1.0


def _run(argv: list[str], root: Path):
    env = {**os.environ, "PYTHONPATH": str(root)}

    def go():
        subprocess.run([sys.executable, *argv], cwd=root, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True)
    return go


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each (default: 5)")
    parser.add_argument("--before", default=None, help="another checkout whose `lens --help` to time alongside")
    args = parser.parse_args(argv)
    cases = {"lens --help": _run(["-m", "app", "--help"], ROOT),
             "lens capture --help": _run(["-m", "app", "capture", "--help"], ROOT),
             "python -c 'import lens'": _run(["-c", "import lens"], ROOT)}
    if args.before:
        cases["lens --help (--before)"] = _run(["-m", "app", "--help"], Path(args.before).resolve())
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (other work on the machine skews times)")
    times = interleaved(cases, repeats=args.repeat, warmup=1)
    base = times["lens --help"]
    for name, t in times.items():
        print(f"{name:<26} {t:6.3f} s   {t / base:5.1f} x lens --help")
    ok = base < GOAL_S and times["lens capture --help"] < GOAL_S
    print(f"goal lens --help and lens capture --help < {GOAL_S:.0f} s: {'met' if ok else 'NOT met'} "
          f"(load average now {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
