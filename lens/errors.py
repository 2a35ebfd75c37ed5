"""Errors raised for bad user input.

`LensInputError` is a `ValueError` whose message says what was expected and what came.
The command line maps it to exit code 2 with a one-line message; anything else is an
internal error (exit code 1).
"""

from __future__ import annotations


class LensInputError(ValueError):
    """Bad input from the user: an unknown model, an empty corpus, a missing layer, ..."""


class ModelLacks(LensInputError):
    """The model has no such thing: a site its family lacks (``resid_mid`` of a parallel block), an LM head
    (an encoder), causal attention. A single analysis asked of it is bad input (exit 2); in the main job
    the study is recorded as not applicable to this model, with this message, and the others go on."""


class StoreCorruptError(LensInputError):
    """A store file does not match the checksum or shape its manifest records."""


class StoreWriteError(LensInputError):
    """A store could not be written (disk full, no inodes left, no permission): nothing committed is lost,
    and the message says how to continue."""


class StoreLockedError(LensInputError):
    """Another live process is writing the store folder."""


class SilentlyWrong(LensInputError):
    """A capture's fidelity check (:mod:`lens.capturing.fidelity`) found the states it would store differ from
    the model's own forward past the stated tolerance: the site map or backend reads another tensor."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a batch scheduler's time limit, ``kill``, a container stopping), raised where the work is so
    it ends as Ctrl-C does: what is written stays consistent and the command says how to resume."""
