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
    import studies.core.runner as runner
    from studies.job.main_job import run_all

    real, calls = runner.run_study, []

    def gated(study, config, folder):
        calls.append(study.name)
        if len(calls) > 1:  # the second study on: it shows as running until the test lets it go
            deadline = time.time() + WAIT_S
            while not Path(go).exists() and time.time() < deadline:
                time.sleep(0.1)
        return real(study, config, folder)

    runner.run_study = gated
    base = {"model": "tiny-llama", "corpus": "wiki-sample", "max_tokens": 300, "seq_len": 128, "batch_size": 8,
            "device": "cpu", "store": None, "seed": 0, "progress": False}
    run_all(base, out, only=only, progress=False, jobs=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
