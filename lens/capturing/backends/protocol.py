"""The contract every capture backend keeps (:class:`CaptureBackend`), so that the capture, the fidelity check
and the unpadded fallback can take any of them: native hooks, TransformerLens' bridge, nnsight (local or on
NDIF) and :class:`lens.capturing.unpadded.EqualLengths` around any of those.

``tests/lens/capturing/test_backend_conformance.py`` holds one suite every backend passes by subclassing it
(as zarr's store tests do): a new backend is a class with these members and a subclass of that suite.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # names for annotations only
    import torch

    from lens.model.loaded import LoadedModel
    from lens.sites import HookSite


@runtime_checkable
class CaptureBackend(Protocol):
    """Runs one padded batch through a model and returns the states at its hook sites.

    ``run(input_ids, attention_mask, return_logits=False)`` takes a ``(batch, seq)`` batch (``attention_mask``
    1 on real tokens, 0 on padding) and returns ``(states, logits)``: ``states`` maps every ``hook.key`` of
    :attr:`hooks` to a tensor ``(batch, seq, width)`` (the values at padded positions are never read),
    ``logits`` is ``(batch, seq, d_vocab)`` when asked for and may be ``None`` otherwise (a backend may stop the
    forward pass after the deepest site it reads).
    """

    name: str  # what --backend names it
    model: LoadedModel  # the model it runs
    hooks: tuple[HookSite, ...]  # the sites it reads, in the caller's order

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
            return_logits: bool = False) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        ...
