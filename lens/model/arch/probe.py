"""One small forward pass that records what every candidate module receives and returns.

The site derivation decides what a module *is* from these tensors (does ``resid_pre + attention``
equal what the MLP's norm receives? does the block return ``resid_pre + attn + mlp``?), so the map
of a family nobody listed by hand is checked on the model itself before any site is read from it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from lens.model.arch.taps import first_tensor, input_tensor

log = logging.getLogger(__name__)

PROBE_BATCH, PROBE_SEQ = 2, 8


@dataclass
class Record:
    """One module's first call in the probe: execution order of its start and end, and the tensors."""

    start: int
    end: int = -1
    inp: torch.Tensor | None = None
    out: torch.Tensor | None = None
    calls: int = 0


@dataclass
class Trace:
    records: dict = field(default_factory=dict)  # module path -> Record
    logits: torch.Tensor | None = None
    hidden_states: tuple | None = None
    batch: int = PROBE_BATCH
    seq: int = PROBE_SEQ
    error: str = ""
    ids: torch.Tensor | None = None

    def get(self, path: str) -> Record | None:
        return self.records.get(path)


def probe_ids(vocab: int, device, batch: int = PROBE_BATCH, seq: int = PROBE_SEQ) -> torch.Tensor:
    """A fixed batch of ordinary token ids (away from the low special ids where the vocabulary allows)."""
    gen = torch.Generator().manual_seed(1234)
    lo = min(10, max(vocab - 2, 0))
    hi = max(min(vocab, 1000), lo + 1)
    return torch.randint(lo, hi, (batch, seq), generator=gen).to(device)


def _copy(x):
    """A copy, as the capture backends take one: a model may later change a tensor in place
    (Falcon adds the attention output into the MLP output's own storage)."""
    return x.detach().clone() if isinstance(x, torch.Tensor) else None


@torch.inference_mode()
def run_probe(model: nn.Module, paths: list[str], vocab: int) -> Trace:
    """Run ``model`` once on :func:`probe_ids`, recording each module in ``paths``."""
    device = next((p.device for p in model.parameters() if not p.is_meta), torch.device("cpu"))
    ids = probe_ids(vocab, device)
    trace = Trace(batch=ids.shape[0], seq=ids.shape[1], ids=ids)
    counter = [0]
    handles = []

    def tick() -> int:
        counter[0] += 1
        return counter[0]

    def pre(path):
        def hook(mod, args, kwargs):
            rec = trace.records.get(path)
            if rec is None:
                trace.records[path] = Record(start=tick(), inp=_copy(input_tensor(args, kwargs)), calls=1)
            else:
                rec.calls += 1
        return hook

    def post(path):
        def hook(mod, args, kwargs, output):
            rec = trace.records.get(path)
            if rec is not None and rec.calls == 1 and rec.end < 0:
                rec.end = tick()
                rec.out = _copy(first_tensor(output))
        return hook

    modules = dict(model.named_modules())
    try:
        for p in paths:
            m = modules.get(p)
            if m is None:
                continue
            handles.append(m.register_forward_pre_hook(pre(p), with_kwargs=True))
            handles.append(m.register_forward_hook(post(p), with_kwargs=True))
        mask = torch.ones_like(ids)
        out = None
        for kwargs in ({"use_cache": False, "output_hidden_states": True}, {"output_hidden_states": True}, {}):
            try:
                out = model(input_ids=ids, attention_mask=mask, **kwargs)
                break
            except TypeError:
                trace.records.clear()
                counter[0] = 0
                continue
        if out is not None:
            trace.logits = getattr(out, "logits", None)
            trace.hidden_states = getattr(out, "hidden_states", None)
    except Exception as exc:  # any failure leaves the map unverified; the derivation says so
        log.info("probe forward failed: %s", exc)
        trace.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    finally:
        for h in handles:
            h.remove()
    return trace


def sequence_change(trace: Trace, prefix: str, d_model: int) -> str:
    """Where the probe saw the sequence change length inside the blocks under ``prefix``: a module that
    receives or returns a (batch, n, d_model) state with ``n`` other than the input's positions, or a
    hidden state of the model's own output with another length (Funnel pools the sequence between its
    blocks). Empty when every state keeps one row per input token."""
    def odd(x) -> int | None:
        if isinstance(x, torch.Tensor) and x.dim() == 3 and x.shape[0] == trace.batch and x.shape[-1] == d_model \
                and x.shape[1] != trace.seq:
            return int(x.shape[1])
        return None

    for path, rec in sorted(trace.records.items(), key=lambda kv: kv[1].start):
        if not (path == prefix or path.startswith(prefix + ".")):
            continue
        for what, x in (("receives", rec.inp), ("returns", rec.out)):
            n = odd(x)
            if n is not None:
                return f"{path} {what} {n} positions for the {trace.seq} input tokens"
    for i, h in enumerate(trace.hidden_states or ()):
        n = odd(h)
        if n is not None:
            return f"hidden_states[{i}] has {n} positions for the {trace.seq} input tokens"
    return ""


PAD_SHORT = 3  # the padding check's short row lacks this many of the probe's positions


@dataclass(frozen=True)
class PaddingCheck:
    """Does a padded row give the states of its unpadded forward? ``max_rel``: the largest difference at a
    real position of a block output, relative to the largest state there (the padded batch against the
    short row run alone, and against the same batch with other tokens under its padding)."""

    invariant: bool | None  # None: the check could not run (the capture then batches as usual)
    max_rel: float | None = None
    where: str = ""
    error: str = ""


def _run(model, ids, mask):
    for kwargs in ({"use_cache": False}, {}):
        try:
            return model(input_ids=ids, attention_mask=mask, **kwargs)
        except TypeError:
            continue
    return model(input_ids=ids)


@torch.inference_mode()
def check_padding(model: nn.Module, block_paths: list[str], vocab: int, pad_id: int, tol: float) -> PaddingCheck:
    """Run a short row alone, then padded beside a full row (twice: pad ids, then other tokens under the
    mask) and compare every block's output at the short row's real positions. Right padding, as the
    capture pads. ``tol``: relative tolerance against the alone run (the model dtype's rounding); the two
    padded runs share every kernel shape, so they must agree to float32 rounding whatever the dtype."""
    device = next((p.device for p in model.parameters() if not p.is_meta), torch.device("cpu"))
    ids = probe_ids(vocab, device)
    n = ids.shape[1] - PAD_SHORT
    mask = torch.ones_like(ids)
    mask[0, n:] = 0
    padded = ids.clone()
    padded[0, n:] = pad_id
    modules = dict(model.named_modules())
    seen: dict = {}
    handles = []

    def post(path):
        def hook(mod, args, output):
            if path not in seen:
                seen[path] = _copy(first_tensor(output))
        return hook

    runs = {}
    try:
        for p in block_paths:
            if p in modules:
                handles.append(modules[p].register_forward_hook(post(p)))
        for name, (x, m) in {"alone": (ids[:1, :n], torch.ones_like(ids[:1, :n])), "padded": (padded, mask),
                             "other": (ids, mask)}.items():
            seen.clear()
            _run(model, x, m)
            runs[name] = dict(seen)
    except Exception as exc:  # noqa: BLE001 - an unrunnable check is recorded as unchecked, not guessed
        return PaddingCheck(None, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}")
    finally:
        for h in handles:
            h.remove()
    worst, where, ok, compared = 0.0, "", True, 0
    for p in block_paths:
        a, b, c = (runs[k].get(p) for k in ("alone", "padded", "other"))
        if not all(isinstance(t, torch.Tensor) and t.dim() == 3 for t in (a, b, c)) or a.shape[1] != n \
                or b.shape[:2] != ids.shape or c.shape != b.shape:
            continue
        compared += 1
        ref = a[0].float()
        scale = float(ref.abs().max()) or 1.0
        d_alone = float((b[0, :n].float() - ref).abs().max()) / scale
        d_other = float((b[0, :n].float() - c[0, :n].float()).abs().max()) / scale
        if d_alone > worst or d_other > worst:
            worst, where = max(d_alone, d_other), p
        if d_alone > tol or d_other > 1e-4:
            ok = False
    if not compared:
        return PaddingCheck(None, error="no block returned a (batch, seq, width) state")
    return PaddingCheck(ok, max_rel=worst, where=where)
