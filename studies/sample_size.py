"""Can a fitted read-out carry a claim? Its training size against the dimension it fits.

A ridge map, a probe, a context-memory regression or a tuned-lens translator fitted on fewer tokens
than a few times the width of the state it reads is underdetermined: with ~700 training tokens for an
896-wide state a ridge fit interpolates its training set, and its held-out score says more about the
regularisation grid than about the model (prediction-gains gave r = +0.263 there, against −0.92 on
20k tokens of another checkpoint). Every study that fits such a read-out checks it here, with one rule:

    training tokens ≥ ``MIN_TOKENS_PER_DIM`` × the fitted dimension   (4 ×: a rule of thumb for linear
    maps, about where the held-out error of ridge and least squares stops being dominated by variance)

and, per the study's ``fit_size`` parameter, either marks the result (``"mark"``, the default: the summary
says ``underdetermined`` with the counts, and every headline of the result carries the mark) or refuses
it with exit 2 naming what to raise (``"refuse"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lens.errors import LensInputError
from studies.contract import scalar

MIN_TOKENS_PER_DIM = 4.0
FIT_SIZE_ACTIONS = ("mark", "refuse")
UNDERDETERMINED = "underdetermined"
TOKENS_PER_DIM = "train_tokens_per_dim"
FIT_SIZE_NOTE = "fit_size_note"
# the summary values every fitting study declares (splice into its summary Names)
SCALARS = (
    scalar(UNDERDETERMINED, f"True when the read-out was fitted on fewer than {MIN_TOKENS_PER_DIM:g} training "
                            "tokens per dimension of the state it reads (studies.sample_size)",
           title="underdetermined fit"),
    scalar(TOKENS_PER_DIM, "training tokens per fitted dimension (the smallest over the study's fits)",
           title="training tokens per dimension", unit="tokens per dimension"),
    scalar(FIT_SIZE_NOTE, "what was fitted on how many tokens, and what to raise when it is underdetermined",
           title="fit size"),
)


@dataclass(frozen=True)
class FitSize:
    """One fitted read-out's size: ``n_train`` training tokens for a ``dim``-wide input ("what": its name)."""

    what: str
    n_train: int
    dim: int
    min_per_dim: float = MIN_TOKENS_PER_DIM

    @property
    def per_dim(self) -> float:
        return self.n_train / self.dim if self.dim else math.inf

    @property
    def underdetermined(self) -> bool:
        return self.per_dim < self.min_per_dim

    @property
    def needed(self) -> int:
        """Training tokens the rule asks for."""
        return int(math.ceil(self.min_per_dim * self.dim))

    def note(self) -> str:
        text = (f"{self.what}: {self.n_train} training tokens for a {self.dim}-wide state "
                f"({self.per_dim:.2f} per dimension)")
        if self.underdetermined:
            text += (f", fewer than {self.min_per_dim:g} per dimension: underdetermined; raise --max-tokens (or "
                     f"the study's token budget) to give the fit at least {self.needed} training tokens")
        return text

    def summary(self) -> dict:
        """The declared summary values (:data:`SCALARS`) for this fit."""
        return {UNDERDETERMINED: self.underdetermined, TOKENS_PER_DIM: round(self.per_dim, 4),
                FIT_SIZE_NOTE: self.note()}


def check_fit_size(study: str, what: str, n_train: int, dim: int, action: str = "mark") -> FitSize:
    """The :class:`FitSize` of one fit; with ``action="refuse"`` an underdetermined fit raises
    :class:`lens.errors.LensInputError` (exit 2 at the command line) naming what to raise."""
    check_action(study, action)
    size = FitSize(what, int(n_train), int(dim))
    if size.underdetermined and action == "refuse":
        raise LensInputError(f"{study}: {size.note()} (or pass --param fit_size=mark to keep it, marked)")
    return size


def check_action(study: str, action: str) -> None:
    """Refuse an unknown ``fit_size`` value before any work (a study's ``check``)."""
    if action not in FIT_SIZE_ACTIONS:
        raise LensInputError(f"{study}: fit_size: expected one of {FIT_SIZE_ACTIONS}, got {action!r}")


def is_underdetermined(record) -> bool:
    """Whether a result record was marked underdetermined (False for results without the mark)."""
    return bool(getattr(record, "summary", {}).get(UNDERDETERMINED))
