"""Run many `lens` command lines in one fresh interpreter (torch is imported once), each with its own
exit code and everything it wrote to file descriptor 2 — what a user sees on the terminal.

Usage: python hostile_cli.py CASES.json RESULTS.json, CASES a list of argv lists."""

import contextlib
import json
import os
import sys
import tempfile


def run(argv: list[str]) -> dict:
    from app.commands.cli import main

    with tempfile.TemporaryFile() as err:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            try:
                rc = main(argv)
            except SystemExit as exc:  # argparse
                rc = exc.code
            except BaseException as exc:  # escaped the CLI: print as Python would
                import traceback

                traceback.print_exc()
                rc = f"escaped {type(exc).__name__}"
            sys.stderr.flush()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        return {"argv": argv, "rc": rc, "stderr": err.read().decode("utf-8", "replace")}


if __name__ == "__main__":
    cases = json.load(open(sys.argv[1]))
    with contextlib.redirect_stdout(sys.stderr):
        out = [run(a) for a in cases]
    json.dump(out, open(sys.argv[2], "w"))
