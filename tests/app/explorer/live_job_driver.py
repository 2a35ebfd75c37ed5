"""A real main job (``run_all`` on tiny-llama, one worker, in this process) whose second study waits for a file:
``python live_job_driver.py OUT GO_FILE STUDIES``. The browser test (test_browser_live_job.py) opens the explorer
while the first study's result has landed and the second is running, then lets the job finish by creating
GO_FILE — so what it sees does not depend on how fast the machine is."""

from __future__ import annotations

import sys
import time
from pathlib import Path

WAIT_S = 120  # the longest the held study waits for GO_FILE: a test that died must not leave a job behind


def main(out: str, go: str, only: str) -> int:
    import studies.job.main_job as main_job

    real, calls = main_job.run_study, []

    def gated(study, config, folder):
        calls.append(study.name)
        if len(calls) > 1:  # the second study on: it shows as running until the test lets it go
            deadline = time.time() + WAIT_S
            while not Path(go).exists() and time.time() < deadline:
                time.sleep(0.1)
        return real(study, config, folder)

    main_job.run_study = gated  # the name run_all calls (it imports run_study from studies.core.runner)
    base = {"model": "tiny-llama", "corpus": "wiki-sample", "max_tokens": 300, "seq_len": 128, "batch_size": 8,
            "device": "cpu", "store": None, "seed": 0, "progress": False}
    main_job.run_all(base, out, only=only, progress=False, jobs=1)
    if len(calls) < 2:  # the hold never happened: the test would wait for a running study that never showed
        print(f"the gate held no study (run_all called it {len(calls)} times): run_all no longer calls "
              "studies.job.main_job.run_study", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
