"""nnsight backend: one trace per batch, saving each requested module's input or output.

The same code path serves a local model and NDIF: ``remote=True`` is passed straight to
``trace`` so a user with NDIF access captures from models too large for their machine. Remotely,
only what is asked for travels back, reduced on the server inside the trace
(:mod:`lens.capturing.backends.server_side`): the real (unpadded) tokens of each requested site (``run``, the
capture contract), the rows at chosen positions (``run_rows``, :mod:`lens.store.positions`), or per-site
sums for :mod:`lens.store.layer_stats` (``run_stats``). The size of that download is estimated before the
request is sent (one estimator, ``estimate_bytes``) and refused above ``LENS_NDIF_MAX_MB``
(default 4096) with what would fit. ``select=True`` runs the same server-side code locally;
``remote="local"`` also makes nnsight serialise the request and replay it here with lens hidden,
as the server would see it — how both are tested without NDIF.
nnsight requires values to be requested in execution order, so taps are sorted by
(layer, position in the block), the position the site map's probe observed for this family.
"""

from __future__ import annotations

import copy
import logging
import os
import warnings
from collections.abc import Iterable

import nnsight
import torch
from nnsight import TransformersModel

from lens.model.arch.taps import INPUT, as_tokens
from lens.capturing.backends import server_side
from lens.capturing.backends.server_side import MOMENTS, MOMENTS_COV, ROWS
from lens.errors import LensInputError
from lens.store.positions import select_positions
from lens.sites import HookSite, Site

log = logging.getLogger(__name__)
DEFAULT_MAX_MB = 4096
LOCAL_SIMULATION = "local"  # remote="local": nnsight serialises the request and runs it here, lens hidden


def execution_order(hook: HookSite, site_map) -> tuple:
    if hook.site is Site.EMBED:
        return (-1, -1)
    if hook.site is Site.FINAL_NORM:
        return (10**9, 0)
    return (hook.layer, site_map.order.get(hook.site, 0))


def _envoy(root, path: str):
    node = root
    for part in path.split("."):
        if part.isdigit():
            node = node[int(part)]
        else:  # nnsight serves .input/.output itself; submodules of those names become E_<name>
            node = getattr(node, f"E_{part}" if part in ("input", "output") else part)
    return node


class NNsightBackend:
    name = "nnsight"

    def __init__(self, model, hooks: Iterable[HookSite], remote: bool | str = False, select: bool | None = None):
        warnings.filterwarnings("ignore", message="Module .* has a submodule named", category=UserWarning)

        self.model = model
        self.hooks = hooks = tuple(hooks)
        self.remote = remote
        self.select = bool(remote) if select is None else select  # gather the real tokens where the model runs
        task = "text-generation" if model.is_causal else "feature-extraction"
        if remote and remote != LOCAL_SIMULATION:  # NDIF hosts the weights: name the hub id, nothing is loaded here
            self.lm = TransformersModel(model.model_id, task=task, tokenizer=model.tokenizer)
        else:  # nnsight rewires every module's forward: wrap a copy, leave the user's model as it was
            self.lm = TransformersModel(copy.deepcopy(model.hf_model), task=task, tokenizer=model.tokenizer)
            if not getattr(model.hf_model, "hf_device_map", None):  # split by accelerate: its hooks place it
                self.lm.to(model.device)  # nnsight dispatches to a GPU when it sees one; stay where the model is
        ordered = sorted(hooks, key=lambda h: execution_order(h, model.site_map))
        self.taps: list[tuple[tuple[str, str, bool], list[str]]] = []  # (path, kind, flat) -> keys reading it
        for h in ordered:
            t = model.site_map.tap(h)
            tap = (t.at(h.layer), t.kind, t.flat_tokens)
            if any(x[0] == tap for x in self.taps):
                next(x for x in self.taps if x[0] == tap)[1].append(h.key)
            else:
                self.taps.append((tap, [h.key]))
        # a rescaled stream's or scaled sub-block's factor (site_map.scales), applied as the native backend does
        self._scales = {h.key: model.site_map.scale(h) for h in hooks if model.site_map.scale(h) != 1.0}
        n_exp = model.site_map.n_experts or 0
        self._widths = [n_exp if any(k.startswith(Site.ROUTER_LOGITS.value) for k in keys) and n_exp else model.d_model
                        for _, keys in self.taps]

        if self.remote:  # the reductions run where the model runs: ship their source with each request
            nnsight.register(server_side)

    def estimate_bytes(self, n_rows: int, reduction: str = ROWS) -> int:
        """Bytes one trace brings back: ``n_rows`` selected rows per site (``ROWS``), or one site's
        statistics per site (``MOMENTS``, ``MOMENTS_COV``, whatever the number of rows)."""
        itemsize = torch.empty(0, dtype=self.model.dtype).element_size()
        return sum(server_side.payload(reduction, n_rows, w, itemsize) for w in self._widths)

    def _check_size(self, n_rows: int, batch: int, reduction: str) -> None:
        limit = float(os.environ.get("LENS_NDIF_MAX_MB", DEFAULT_MAX_MB)) * 2**20
        size = self.estimate_bytes(n_rows, reduction)
        log.info("nnsight %s request: %d rows x %d sites (%s) -> about %.1f MB back",
                 "remote" if self.remote else "local", n_rows, len(self.taps), reduction, size / 2**20)
        if size <= limit:
            return
        head = (f"one NDIF request would bring back about {size / 2**20:.0f} MB ({len(self.taps)} sites, "
                f"{reduction}{f' of {n_rows} tokens' if reduction == ROWS else ''}), over the "
                f"{limit / 2**20:.0f} MB limit (LENS_NDIF_MAX_MB)")
        if reduction == ROWS:
            fit = max(1, int(batch * limit // size))
            raise LensInputError(f"{head}: use --batch-size {fit} or fewer, or fewer sites / layers")
        per_site = size / len(self.taps)  # statistics do not shrink with the batch: only fewer sites help
        fit = int(limit // per_site)
        lighter = self.estimate_bytes(n_rows, MOMENTS)
        raise LensInputError(
            f"{head}: at most {fit} of the {len(self.taps)} sites fit in one request"
            + (f"; without the covariance (--no-cov) all of them take {lighter / 2**20:.1f} MB"
               if reduction == MOMENTS_COV and lighter <= limit else ""))

    def _trace(self, input_ids, attention_mask, reduction: str, index, return_logits: bool):
        """One trace; returns (one value per tap, logits or None) and records ``last_bytes``.

        The traced block names only picklable things (envoys, tensors, strings and the functions
        of :mod:`lens.capturing.backends.server_side`), so that nnsight can ship it to NDIF; its results
        come back through one saved list (only saved values return from a remote request)."""
        envs = [(_envoy(self.lm, path), kind == INPUT) for (path, kind, _), _ in self.taps]
        lm, take, moments, gram = self.lm, server_side.take_rows, server_side.moment_sums, reduction == MOMENTS_COV
        got = logits = None
        with torch.inference_mode():
            with self.lm.trace({"input_ids": input_ids, "attention_mask": attention_mask},
                               remote=self.remote, use_cache=False):
                got = nnsight.save([])
                for env, read_input in envs:
                    value = env.input if read_input else env.output
                    value = value[0] if isinstance(value, (tuple, list)) else value
                    if index is None:  # copied where it is read: the model may change it in place (Falcon's MLP)
                        got.append(value.clone())
                    elif reduction == ROWS:
                        got.append(take(value, index))
                    else:
                        got.append(moments(value, index, gram))
                if return_logits:
                    logits = nnsight.save(lm.output.logits)
        self.last_bytes = sum(t.numel() * t.element_size() for v in got
                              for t in (v if isinstance(v, tuple) else (v,)) if t is not None)
        return got, logits

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, return_logits: bool = False):
        """``{hook key: (batch, seq, width)}`` for one padded batch (the capture contract); with ``select``
        only the real tokens travel and the padding is rebuilt here as zeros."""
        index = None
        if self.select:  # flat positions of the real tokens: only those rows travel back
            index = attention_mask.reshape(-1).nonzero().squeeze(1)
            self._check_size(int(index.numel()), int(input_ids.shape[0]), ROWS)
        got, logits = self._trace(input_ids, attention_mask, ROWS, index, return_logits)
        out = {}
        for ((_, _, flat), keys), value in zip(self.taps, got):
            if index is not None:  # back to (batch, seq, width), zeros at the padding nobody reads
                rows = torch.zeros((input_ids.numel(), value.shape[-1]), dtype=value.dtype, device=value.device)
                value = rows.index_copy_(0, index.to(value.device), value).reshape(*input_ids.shape, -1)
            value = as_tokens(value, *input_ids.shape, flat)
            for k in keys:
                out[k] = value * self._scales[k] if k in self._scales else value
        return out, logits

    def run_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions="all"):
        """``({hook key: (rows, width)}, Selection)``: only the rows at ``positions`` (see
        :func:`lens.store.positions.select_positions`) are gathered on the server and travel back."""
        sel = select_positions(attention_mask, positions)
        self._check_size(sel.n, int(input_ids.shape[0]), ROWS)
        got, _ = self._trace(input_ids, attention_mask, ROWS, sel.index, False)
        return {k: value * self._scales[k] if k in self._scales else value
                for (_, keys), value in zip(self.taps, got) for k in keys}, sel

    def run_stats(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions="all", cov: bool = True):
        """``({hook key: (sums, triangle or None)}, Selection)``: the statistics of the rows at
        ``positions``, reduced on the server (:func:`lens.capturing.backends.server_side.moment_sums`)."""
        if self._scales:  # sums reduced where the model runs would be of the unscaled module tensors
            raise LensInputError(
                f"{self.model.family} rescales {', '.join(sorted(self._scales))} (see lens inspect): statistics "
                "reduced on the server are not supported for scaled sites; collect rows instead")
        sel = select_positions(attention_mask, positions)
        reduction = MOMENTS_COV if cov else MOMENTS
        self._check_size(sel.n, int(input_ids.shape[0]), reduction)
        got, _ = self._trace(input_ids, attention_mask, reduction, sel.index, False)
        return {k: value for (_, keys), value in zip(self.taps, got) for k in keys}, sel
