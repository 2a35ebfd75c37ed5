"""Capture without padding, for families whose states change when a row is padded.

The architecture probe (:func:`lens.model.arch.probe.check_padding`) compares a padded row with its
unpadded forward; a family that fails it (ConvBERT: its convolution mixes the padding into the real
positions) has ``site_map.padding_invariant = False``. For such a model, :class:`EqualLengths` runs each
padded batch as one forward per distinct window length, every row cut to its own length (no padding at
all), and puts the states back at their places in the batch, so batching, gathering, row order and the
store are unchanged. Windows of one length still run together: a capture of full-length windows with a
short last window per document costs one extra forward per short window. A padding-invariant family is
given its engine as it is (:func:`unpadded_if_needed`), so it batches exactly as before.
"""

from __future__ import annotations

import torch

from lens.errors import LensInputError


class EqualLengths:
    """An engine's ``run`` with no padded row: rows grouped by real length, each group's real tokens
    (wherever its padding sits) run together without padding; states (and logits) re-placed in the padded
    batch's shape, zeros at the padded positions (which the capture never reads)."""

    def __init__(self, engine):
        self.engine = engine
        self.name = engine.name

    def __getattr__(self, item):  # hooks, model, ... of the wrapped engine
        return getattr(self.engine, item)

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs):
        real = attention_mask.bool()
        lengths = real.sum(dim=1)
        distinct = [int(n) for n in torch.unique(lengths).tolist()]
        if len(distinct) == 1 and distinct[0] == input_ids.shape[1]:
            return self.engine.run(input_ids, attention_mask, **kwargs)
        shape = tuple(input_ids.shape)
        out: dict = {}
        logits_out = None
        for n in distinct:
            rows = torch.nonzero(lengths == n).flatten()
            where = torch.zeros_like(real)
            where[rows] = real[rows]  # the real positions of these rows, wherever the padding sits
            ids = input_ids[where].reshape(len(rows), n)
            states, logits = self.engine.run(ids, torch.ones_like(ids), **kwargs)
            for key, v in states.items():
                if key not in out:
                    out[key] = v.new_zeros(shape + tuple(v.shape[2:]))
                out[key][where.to(v.device)] = v.reshape((-1,) + tuple(v.shape[2:]))
            if logits is not None:
                if logits_out is None:
                    logits_out = logits.new_zeros(shape + tuple(logits.shape[2:]))
                logits_out[where.to(logits.device)] = logits.reshape((-1,) + tuple(logits.shape[2:]))
        return out, logits_out


    def _unpadded_only(self, attention_mask: torch.Tensor, what: str) -> None:
        if len(torch.unique(attention_mask.sum(dim=1))) > 1:
            raise LensInputError(
                f"{self.engine.model.family} is not padding-invariant (see lens inspect): {what} of a padded batch "
                "would mix the padding into real positions; use --batch-size 1")

    def run_rows(self, input_ids, attention_mask, *args, **kwargs):
        self._unpadded_only(attention_mask, "rows selected where the model runs")
        return self.engine.run_rows(input_ids, attention_mask, *args, **kwargs)

    def run_stats(self, input_ids, attention_mask, *args, **kwargs):
        self._unpadded_only(attention_mask, "statistics reduced where the model runs")
        return self.engine.run_stats(input_ids, attention_mask, *args, **kwargs)


def unpadded_if_needed(engine, model):
    """``engine`` itself for a padding-invariant family (or one whose check could not run), else wrapped
    in :class:`EqualLengths`."""
    if getattr(model.site_map, "padding_invariant", None) is False:
        return EqualLengths(engine)
    return engine
