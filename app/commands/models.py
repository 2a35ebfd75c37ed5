"""``lens models``, ``lens corpora`` and ``lens inspect``: what there is to run, and one model's hook sites."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time

from app.commands.flags import add_memory_flag, add_model_args, load_model_from_args
from lens.model.describe import describe, format_description


def add_parsers(sub) -> None:
    sub.add_parser("models", help="list model aliases and whether each is installed")
    sub.add_parser("corpora", help="list built-in corpora")

    ins = sub.add_parser("inspect", help="show a model's hook-site map, absent sites and family facts")
    ins.add_argument("model", help="alias, tiny:<model_type>, Hugging Face id, model folder or .gguf file")
    ins.add_argument("--json", action="store_true", help="print the description as JSON")
    add_memory_flag(ins)
    add_model_args(ins)


def _cmd_models(args):
    from lens.model.loading import list_models

    for row in list_models():
        mark = "installed" if row["installed"] else f"missing ({row['package']})"
        print(f"{row['alias']:<14} {mark:<12} {row['description']}")


def _cmd_corpora(args):
    from lens.text.corpora import list_corpora

    for row in list_corpora():
        mark = "available" if row["available"] else "missing"
        print(f"{row['name']:<12} {mark:<10} {row['description']}")


def _cmd_inspect(args):
    with _loading(args.model):  # torch, transformers and the weights: tens of seconds before the first line
        model = load_model_from_args(args)

    d = describe(model)
    print(json.dumps(d, indent=1) if args.json else format_description(d))


@contextlib.contextmanager
def _loading(what: str, tick_s: float = 1.0):
    """A progress line on stderr while ``what`` loads, its seconds counting up, ended by how long it took.

    On a terminal only, like a progress bar that redraws itself: a refused load wipes the line, so the
    error stays the one line on stderr; piped or redirected stderr gets nothing (-v logs the load)."""
    logging.getLogger("lens.cli").info("loading %s", what)
    if not sys.stderr.isatty():
        yield
        return

    t0, stop = time.time(), threading.Event()

    def draw():
        while True:
            sys.stderr.write(f"\rloading {what}: {time.time() - t0:.0f} s")
            sys.stderr.flush()
            if stop.wait(tick_s):
                return

    painter = threading.Thread(target=draw, daemon=True)
    painter.start()
    loaded = False
    try:
        yield
        loaded = True
    finally:
        stop.set()
        painter.join()
        sys.stderr.write(f"\rloaded {what} in {time.time() - t0:.1f} s\033[K\n" if loaded else "\r\033[K")
        sys.stderr.flush()


COMMANDS = {"models": _cmd_models, "corpora": _cmd_corpora, "inspect": _cmd_inspect}
