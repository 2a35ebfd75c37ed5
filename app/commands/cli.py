"""The ``lens`` command line: its entry point (``lens = "app.commands.cli:main"``) and its error boundary.

Exit codes: 0 success; 2 bad input (one line on stderr, no traceback); 1 internal error.

The parser (app/commands/parser.py) is built from cheap modules only (no torch): ``lens
--help`` and an argument error answer at once, and each command (app/commands/, one module per command group)
imports what it needs when it runs (tests/app/commands/test_cli.py checks). Whatever a command raises ends here: bad
input, or a bad file or machine, as one line and exit 2; anything else as an internal error, exit 1.
"""

from __future__ import annotations

import errno
import logging
import os
import pickle
import signal
import sys
import traceback

from app.commands.parser import COMMANDS, build_parser
from lens.errors import LensInputError, Terminated
from lens.runtime.threads import configure_threads

__all__ = ["build_parser", "main"]


# what an OSError's errno means for the user, and what to do about it
_OS_ERRORS = {
    "ENOSPC": ("the disk is full", "free some space or choose another folder, then rerun"),
    "EDQUOT": ("the disk quota is used up", "free some space or choose another folder, then rerun"),
    "EROFS": ("the filesystem is read-only", "choose a writable folder"),
    "EACCES": ("permission denied", "fix its permissions or choose another path"),
    "EPERM": ("operation not permitted", "fix its permissions or choose another path"),
    "EEXIST": ("it already exists", "remove it or choose another path"),
    "ENAMETOOLONG": ("the name is longer than the filesystem allows", "choose a shorter path or name"),
    "ENOTDIR": ("a part of the path is a file, not a folder", "fix the path"),
    "EISDIR": ("it is a folder where a file was expected", "fix the path"),
    "ENOENT": ("it does not exist", "check the path"),
    "ELOOP": ("it is a symbolic link where none is allowed (or a loop of links)",
              "replace the link by the file or folder itself"),
    "EIO": ("an input/output error (a failing disk or network filesystem)", "check the disk, then rerun"),
    "EFBIG": ("the file is larger than the filesystem allows", "choose another filesystem"),
    "EMFILE": ("too many open files", "raise the open-file limit (ulimit -n), then rerun"),
    "ENFILE": ("too many open files on this machine", "close some programs, then rerun"),
    "ENXIO": ("it is a device or pipe that cannot be used here", "use a regular file"),
}


# errnos of writing: after them a `lens study all` keeps what it finished (--resume goes on)
_WRITE_ERRNOS = ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "EIO", "EFBIG")


def _short_path(path) -> str:
    """A path for a one-line message: a name too long for the filesystem is shown by its two ends."""
    text = os.fsdecode(path) if isinstance(path, (bytes, os.PathLike)) else str(path)
    return text if len(text) <= 160 else f"{text[:80]}…{text[-60:]} ({len(text)} characters)"


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _describe_os_error(exc: OSError, args) -> str:
    """One line for an OSError: the path, what is wrong with it, what to do."""
    name = errno.errorcode.get(exc.errno or -1)
    if name is None:  # a library's OSError without an errno (transformers: "Can't load the configuration ...")
        what = getattr(args, "model", None)
        return _one_line(f"{what}: {exc}" if what and str(what) not in str(exc) else str(exc))
    why, todo = _OS_ERRORS.get(name, (exc.strerror or name, "fix that, then rerun"))
    where = _short_path(exc.filename) if exc.filename is not None else None
    if exc.filename2 is not None:
        where = f"{where} -> {_short_path(exc.filename2)}"
    if getattr(args, "command", None) == "study" and getattr(args, "name", None) == "all" and name in _WRITE_ERRNOS:
        todo += "; with --resume the studies already finished are kept"
    head = f"{where}: {why}" if where else why
    return _one_line(f"{head} ({exc.strerror or name}); {todo}")


def _raised_in(exc: BaseException, path_part: str, functions=()) -> bool:
    """Whether a frame of ``exc``'s traceback runs code from a file whose path has ``path_part`` (and,
    when given, one of ``functions``)."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if path_part in code.co_filename.replace(os.sep, "/") and (not functions or code.co_name in functions):
            return True
        tb = tb.tb_next
    return False


def _bad_environment(exc: BaseException, args) -> str | None:
    """The one line for an exception that comes from the user's files or machine rather than from a bug
    (a full disk, a damaged model file, a tokenizer that does not load, JSON nested past reason), or
    None for an internal error."""
    model = getattr(args, "model", None)
    of = f" of {model}" if model else ""
    if isinstance(exc, OSError):
        return _describe_os_error(exc, args)
    if isinstance(exc, pickle.UnpicklingError):  # torch.load(weights_only=True) refused a pickle: good
        return (f"the weights{of} are a pickled checkpoint that cannot be loaded safely (lens never runs "
                "pickled code): convert it to model.safetensors, or use the model's safetensors files")
    if type(exc).__name__ == "SafetensorError":
        return _one_line(f"a safetensors file{of} is damaged or not a safetensors file ({exc}): replace the "
                         "model's files (download them again)")
    if isinstance(exc, RecursionError):
        inputs = [f"{k} {getattr(args, a)}" for k, a in (("model", "model"), ("corpus", "corpus"))
                  if getattr(args, a, None)]
        return (f"an input is nested too deeply to read (RecursionError){' — check ' + ', '.join(inputs) if inputs else ''}: "
                "a JSON value nested thousands of levels deep is not a corpus text, config or tokenizer")
    if _raised_in(exc, "/tokeniz", ("from_pretrained", "_from_pretrained", "from_file", "from_str")):
        return _one_line(f"the tokenizer{of} cannot be loaded ({type(exc).__name__}: {exc}): its tokenizer files "
                         "(tokenizer.json, tokenizer_config.json) are damaged or not a tokenizer; replace them")
    return None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)  # --help and argument errors end here, before torch is imported
    args.argv = sys.argv[1:] if argv is None else [str(a) for a in argv]  # as given (lens capture --nproc-per-node)

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if getattr(args, "no_memory_check", False):  # read by lens.load_model here and in study workers
        os.environ["LENS_NO_MEMORY_CHECK"] = "1"
    if args.command in ("capture", "stats", "study"):  # heavy work: size every thread pool once, from the cores we have

        configure_threads()
    previous = _end_on_sigterm() if args.command in ("capture", "stats", "study") else None
    try:
        rc = COMMANDS[args.command](args)
        if isinstance(rc, int):
            return rc
    except LensInputError as exc:
        return _refuse(" ".join(str(exc).splitlines()))
    except KeyboardInterrupt as exc:
        resume = " (rerun with --resume to go on)" if args.command in ("capture", "study") else ""
        if isinstance(exc, Terminated):
            print(f"lens: stopped by SIGTERM{resume}", file=sys.stderr)
            return 128 + signal.SIGTERM
        print(f"lens: interrupted{resume}", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one boundary: bad files / machine (exit 2) or a bug (exit 1)
        try:
            line = _bad_environment(exc, args)
        except Exception:  # noqa: BLE001 - describing must never hide the error itself
            line = None
        if line is not None:
            return _refuse(line)
        print(f"lens: internal error: {type(exc).__name__}: {_one_line(exc, 1000)}", file=sys.stderr)
        if os.environ.get("LENS_DEBUG"):
            traceback.print_exc()
        return 1
    finally:
        if previous is not None:  # main() called in a process that goes on (a test, a notebook)
            signal.signal(signal.SIGTERM, previous)
    return 0


def _end_on_sigterm():
    """SIGTERM ends the work as Ctrl-C does (lens.errors.Terminated, a KeyboardInterrupt): a capture leaves a
    store that resumes, a main job records that it stopped. The default would end the process at once.
    Returns the handler it replaced (None where no handler can be set: not the main thread)."""
    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
        raise Terminated()

    try:
        return signal.signal(signal.SIGTERM, stop)
    except ValueError:  # main() called from another thread (an embedding program): leave signals alone
        return None


def _refuse(line: str) -> int:
    """Bad input or a bad environment: one line on stderr, exit 2 (LENS_DEBUG=1 adds the traceback)."""
    print("lens: error: " + line, file=sys.stderr)
    if os.environ.get("LENS_DEBUG"):
        traceback.print_exc()
    return 2


if __name__ == "__main__":
    sys.exit(main())
