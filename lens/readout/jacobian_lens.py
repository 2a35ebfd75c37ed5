"""Jacobian lens: decode layer l through the model's own head after the average Jacobian of the last layer.

Gurnee et al. 2026 ("Verbalizable Representations Form a Global Workspace in Language Models", reference code
``anthropics/jacobian-lens``, ``jlens/fitting.py`` and ``jlens/lens.py``): ``lens_l(h) = unembed(final_norm(J_l h))``
with ``J_l = E[∂h_final / ∂h_l]``. Conventions fixed here, each the reference's:

* ``h_l`` is the output of block ``l`` (0-based): our ``resid_post`` of layer ``l`` (the reference hooks the
  output of ``model.layers[l]``). ``h_final`` is the output of the last block, *before* the final norm
  (``resid_post`` of layer ``L-1``); the final norm and the unembedding are applied after ``J_l``, so at the
  last layer ``J = I`` and the lens is the logit lens. Layers ``0 .. L-2`` are fitted. (The known failure of
  re-implementations is an off-by-one here: taking ``hidden_states[l]``, the *input* of block ``l``.)
* Per prompt (one window of at most ``max_seq_len`` tokens, BOS included), the valid positions are
  ``skip_first <= p < T-1``: the first ``skip_first`` (default 16) are attention sinks with atypical residuals,
  the last has no next token. A one-hot cotangent on output dimension ``i`` is put at *every* valid target
  position at once, so the gradient at source position ``p`` is ``Σ_{p' valid} ∂h_final[p']_i / ∂h_l[p]`` (the
  reference's "future sum": causal attention makes the terms with ``p' < p`` zero); row ``i`` of the prompt's
  estimator is its mean over the valid source positions ``p``.
* ``J_l`` is the mean over prompts of the per-prompt estimators. We keep it as a **sum and a count**
  (:class:`JacobianSums`, float64), so fits on disjoint prompts add up exactly: ``--part I/N``, torchrun ranks
  (:func:`lens.readout.jacobian_fit.all_reduce`) and a Slurm array's parts merged afterwards all equal the single
  fit up to float64 summation order.

Files (:meth:`JacobianSums.save`): safetensors, one float64 ``sum.<layer>`` (d × d) per fitted layer, with the
provenance as JSON in the header's metadata (model, revision, site, layers, width, positions skipped, the
prompts' digests, dtypes, parts). A lens of another model, site or width is refused by name
(:meth:`JacobianLens.check_model`); a truncated file, a pickled one and parts fitted with other settings are
refused with one line. A published lens in the reference's layout — one d × d matrix per layer — loads with
:func:`load_lens` from safetensors (keys ``<layer>`` or ``J.<layer>``) or from the reference's own ``torch.save``
file, parsed without unpickling (:mod:`lens.readout.torch_archive`: tensors in plain containers only).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from lens.errors import LensInputError
from lens.readout.logit_lens import lens_metrics, model_readout
from lens.readout.torch_archive import is_torch_archive, read_torch_archive
from lens.runtime.atomic import atomic_path

FORMAT = "lens-workbench jacobian lens"
VERSION = 1
META_KEY = "lens_workbench"
SKIP_FIRST = 16  # the reference's SKIP_FIRST_N_POSITIONS
MAX_SEQ_LEN = 128  # the reference's default max_seq_len
ESTIMATOR = "future_sum: per prompt, one-hot cotangent at every valid target position, mean over valid source positions"
SITE = "resid_post"
_PUBLISHED_KEY = re.compile(r"^(?:J\.)?(\d+)$")


@dataclass(frozen=True)
class JacobianSettings:
    """What a fit depends on; two sums add only when these are equal (the corpus is provenance, not a setting:
    parts of one fit may come from one corpus' disjoint windows)."""

    model_id: str
    revision: str
    n_layers: int
    d_model: int
    layers: tuple[int, ...]
    skip_first: int = SKIP_FIRST
    max_seq_len: int = MAX_SEQ_LEN
    site: str = SITE
    model_dtype: str = "float32"
    accumulate_dtype: str = "float64"
    estimator: str = ESTIMATOR

    def differences(self, other: "JacobianSettings") -> list[str]:
        a, b = asdict(self), asdict(other)
        return [f"{k}={a[k]!r} vs {b[k]!r}" for k in a if a[k] != b[k]]


@dataclass
class JacobianSums:
    """Per fitted layer the sum over prompts of the per-prompt estimators, and how many prompts.

    ``sums``: (layer, d_out, d_in) float64, ``layer`` following ``settings.layers``; ``digests``: a short sha256
    of each prompt's token ids (so a merge refuses a prompt counted twice); ``parts``: which parts this holds
    (``"1/2"`` ...; empty for a single fit); ``corpus``: where the prompts came from."""

    settings: JacobianSettings
    sums: torch.Tensor
    n_prompts: int = 0
    n_positions: int = 0
    digests: list[str] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    corpus: str = ""
    skipped: int = 0  # prompts too short to have a valid position

    @classmethod
    def empty(cls, settings: JacobianSettings, corpus: str = "") -> "JacobianSums":
        d = settings.d_model
        return cls(settings, torch.zeros(len(settings.layers), d, d, dtype=torch.float64), corpus=corpus)

    def lens(self) -> "JacobianLens":
        if self.n_prompts < 1:
            raise LensInputError("the Jacobian lens was fitted on no prompt (every prompt shorter than "
                                 f"skip_first + 2 = {self.settings.skip_first + 2} tokens?)")
        return JacobianLens(self.settings, (self.sums / self.n_prompts).float(), self.n_prompts, self)

    # ------------------------------------------------------------------ persistence
    def metadata(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "settings": asdict(self.settings), "n_prompts": self.n_prompts,
                "n_positions": self.n_positions, "digests": self.digests, "parts": self.parts,
                "corpus": self.corpus, "skipped": self.skipped}

    def save(self, path) -> Path:
        """Written whole or not at all (:func:`lens.runtime.atomic.atomic_path`)."""
        path = Path(path)
        if path.parent and not path.parent.is_dir():
            raise LensInputError(f"cannot write {path}: folder {path.parent} does not exist")
        tensors = {f"sum.{l}": self.sums[i].contiguous() for i, l in enumerate(self.settings.layers)}
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(self.metadata())})
        return path

    @classmethod
    def load(cls, path) -> "JacobianSums":
        tensors, meta = _read(path)
        if meta is None:
            raise LensInputError(f"{path} holds Jacobian matrices without our provenance (a published lens?): "
                                 "it has no sums to merge; read it with load_lens")
        s = meta["settings"]
        settings = JacobianSettings(**{**s, "layers": tuple(int(l) for l in s["layers"])})
        d = settings.d_model
        sums = torch.zeros(len(settings.layers), d, d, dtype=torch.float64)
        for i, l in enumerate(settings.layers):
            t = tensors.get(f"sum.{l}")
            if t is None or tuple(t.shape) != (d, d):
                raise LensInputError(f"{path}: tensor sum.{l} missing or not {d} x {d}")
            sums[i] = t.double()
        return cls(settings, sums, int(meta["n_prompts"]), int(meta["n_positions"]), list(meta["digests"]),
                   list(meta["parts"]), meta.get("corpus", ""), int(meta.get("skipped", 0)))


def merge_sums(parts: Sequence[JacobianSums], names: Sequence[str] | None = None) -> JacobianSums:
    """The sum of fits on disjoint prompts (parts of one ``--part I/N`` split, or any disjoint fits of the same
    settings). Refused: other settings (named), a prompt in two parts, a part given twice, parts of different
    splits."""
    if not parts:
        raise LensInputError("nothing to merge: give at least one Jacobian-lens part")
    names = list(names) if names is not None else [f"part {i + 1}" for i in range(len(parts))]
    first = parts[0]
    for name, p in zip(names[1:], parts[1:]):
        diff = first.settings.differences(p.settings)
        if diff:
            raise LensInputError(f"{name} was fitted with other settings than {names[0]}: {'; '.join(diff)}")
    labels = [lab for p in parts for lab in p.parts]
    if len(set(labels)) != len(labels):
        raise LensInputError(f"a part is given twice: {sorted(labels)}")
    counts = {lab.split("/")[1] for lab in labels}
    if len(counts) > 1:
        raise LensInputError(f"parts of different splits: {sorted(labels)}")
    seen: dict[str, str] = {}
    for name, p in zip(names, parts):
        for dg in p.digests:
            if dg in seen:
                raise LensInputError(f"a prompt is in both {seen[dg]} and {name}: parts must hold disjoint prompts")
            seen[dg] = name
    sums = first.sums.clone()
    for p in parts[1:]:
        sums += p.sums
    corpora = sorted({p.corpus for p in parts if p.corpus})
    return JacobianSums(first.settings, sums, sum(p.n_prompts for p in parts), sum(p.n_positions for p in parts),
                        [d for p in parts for d in p.digests], sorted(labels), ", ".join(corpora),
                        sum(p.skipped for p in parts))


def missing_parts(sums: JacobianSums) -> list[str]:
    """Parts of the split ``sums`` belongs to that it does not hold (empty for a single fit or a whole split)."""
    if not sums.parts:
        return []
    n = int(sums.parts[0].split("/")[1])
    return [f"{i}/{n}" for i in range(1, n + 1) if f"{i}/{n}" not in sums.parts]


class JacobianLens:
    """The fitted lens: ``matrices`` (layer, d_out, d_in) float32 means, for ``settings.layers``; the last layer
    (``n_layers - 1``) is the identity and every other layer without a matrix is refused."""

    def __init__(self, settings: JacobianSettings, matrices: torch.Tensor, n_prompts: int,
                 sums: JacobianSums | None = None):
        d = settings.d_model
        if matrices.shape != (len(settings.layers), d, d):
            raise LensInputError(f"Jacobian matrices of shape {tuple(matrices.shape)}, expected "
                                 f"({len(settings.layers)}, {d}, {d})")
        self.settings = settings
        self.matrices = matrices
        self.n_prompts = int(n_prompts)
        self.sums = sums
        self._on: dict = {}

    @property
    def layers(self) -> list[int]:
        return list(self.settings.layers)

    def matrix(self, layer: int) -> torch.Tensor:
        """J_l (d_out, d_in); the identity at the last layer."""
        layer = int(layer)
        if layer == self.settings.n_layers - 1:
            return torch.eye(self.settings.d_model)
        try:
            return self.matrices[self.settings.layers.index(layer)]
        except ValueError:
            raise LensInputError(f"the Jacobian lens has no matrix for layer {layer} (fitted: "
                                 f"{list(self.settings.layers)})") from None

    def translate(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """``J_l h`` for (..., d_model) states; the last layer passes unchanged."""
        if int(layer) == self.settings.n_layers - 1:
            return h
        key = (int(layer), h.device)
        J = self._on.get(key)
        if J is None:
            J = self._on[key] = self.matrix(layer).to(h.device, torch.float32)
        return (h.float() @ J.T).to(h.dtype)

    def check_model(self, model, site: str = SITE) -> None:
        """Refuse a model, site or width this lens was not fitted for, by name (one line)."""
        s = self.settings
        mid = getattr(model, "model_id", "")
        if s.model_id and mid and mid != s.model_id:
            raise LensInputError(f"this Jacobian lens was fitted on {s.model_id}, not {mid}")
        if int(model.d_model) != s.d_model or int(model.n_layers) != s.n_layers:
            raise LensInputError(f"this Jacobian lens is for {s.n_layers} layers of width {s.d_model} "
                                 f"({s.model_id or 'a published lens'}); {mid or 'the model'} has {model.n_layers} "
                                 f"of width {model.d_model}")
        site = getattr(site, "value", site)
        if site != s.site:
            raise LensInputError(f"this Jacobian lens reads {s.site}, not {site}")

    def readout(self, model, site: str = SITE):
        """The model's final norm and unembedding after ``J_l``, for :func:`lens.readout.logit_lens.lens_metrics`."""
        self.check_model(model, site)
        return model_readout(model, self.translate)


def jacobian_lens_metrics(model, lens: JacobianLens, states, final, next_token_ids, site: str = SITE, **kwargs):
    """:func:`lens.readout.logit_lens.lens_metrics` with the Jacobian lens' decoder."""
    kwargs.setdefault("device", model.device)
    kwargs.setdefault("dtype", torch.float32)
    return lens_metrics(states, final, next_token_ids, lens.readout(model, site), **kwargs)


# ---------------------------------------------------------------------- reading files
def _head(path, n: int = 2) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def _read(path) -> tuple[dict, dict | None]:
    """(tensors, our metadata or None) of a safetensors file; a pickled, truncated or foreign file refused."""
    path = Path(path)
    if not path.is_file():
        raise LensInputError(f"no Jacobian-lens file at {path}")
    with open(path, "rb") as f:
        head, brace = f.read(8), f.read(1)
    n = int.from_bytes(head, "little") if len(head) == 8 else 0
    safetensors_like = 0 < n <= path.stat().st_size - 8 and brace == b"{"  # u64 header length, then JSON
    if not safetensors_like and (head[:2] == b"PK" or head[:1] == b"\x80"):  # torch.save's zip / a bare pickle
        raise LensInputError(f"{path} is a pickled file (torch.save), not a part of `lens jlens fit`: nothing is "
                             "unpickled (a published lens in the reference's torch.save file is read by load_lens, "
                             "which parses it without unpickling)")
    try:
        tensors = {}
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            for k in f.keys():
                tensors[k] = f.get_tensor(k)
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise LensInputError(f"{path} is not a whole safetensors file (truncated or damaged?): {exc}") from None
    if META_KEY not in meta:
        return tensors, None
    try:
        ours = json.loads(meta[META_KEY])
    except json.JSONDecodeError:
        raise LensInputError(f"{path}: its provenance metadata is not JSON (damaged file)") from None
    if ours.get("format") != FORMAT or ours.get("version") != VERSION:
        raise LensInputError(f"{path} is not a {FORMAT} of version {VERSION} "
                             f"(format {ours.get('format')!r}, version {ours.get('version')!r})")
    return tensors, ours


def load_lens(path, model=None) -> JacobianLens:
    """A Jacobian lens from a file: ours (sums + provenance; refused when its parts are incomplete) or a published
    one in the reference's layout (one d × d matrix per layer, keys ``<layer>`` or ``J.<layer>``), which carries no
    model name: ``model`` then supplies it, after the widths are checked."""
    if Path(path).is_file() and not is_torch_archive(path) and _head(path) == b"PK":
        raise LensInputError(f"{path} is not a whole zip / torch.save archive (truncated or damaged?)")
    if Path(path).is_file() and is_torch_archive(path):  # the reference's own file (torch.save): parsed, not unpickled
        obj = read_torch_archive(path)
        if not isinstance(obj, dict) or not isinstance(obj.get("J"), dict):
            raise LensInputError(f"{path} is a torch.save archive without the reference's 'J' (layer -> matrix)")
        by_layer = {}
        for k, t in obj["J"].items():
            if not isinstance(k, int) or not isinstance(t, torch.Tensor):
                raise LensInputError(f"{path}: J holds {k!r} -> {type(t).__name__}, expected layer -> matrix")
            by_layer[k] = t
        return _published(path, by_layer, model, int(obj.get("n_prompts") or 0))
    tensors, meta = _read(path)
    if meta is not None:
        sums = JacobianSums.load(path)
        missing = missing_parts(sums)
        if missing:
            raise LensInputError(f"{path} holds parts {sums.parts} of a split: parts {missing} are missing "
                                 "(merge every part with `lens jlens merge`)")
        return sums.lens()
    by_layer = {}
    for k, t in tensors.items():
        m = _PUBLISHED_KEY.match(k)
        if m is None:
            raise LensInputError(f"{path}: tensor {k!r} is neither ours nor a per-layer matrix (<layer> or J.<layer>)")
        by_layer[int(m.group(1))] = t
    return _published(path, by_layer, model)


def _published(path, by_layer: dict, model, n_prompts: int = 0) -> JacobianLens:
    if not by_layer:
        raise LensInputError(f"{path} holds no Jacobian matrix")
    shapes = {tuple(t.shape) for t in by_layer.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2 or len(set(next(iter(shapes)))) != 1:
        raise LensInputError(f"{path}: expected one square d x d matrix per layer, got shapes {sorted(shapes)}")
    d = next(iter(shapes))[0]
    layers = tuple(sorted(by_layer))
    n_layers = (model.n_layers if model is not None else layers[-1] + 2)
    settings = JacobianSettings(model_id="", revision="", n_layers=int(n_layers), d_model=int(d), layers=layers,
                                model_dtype=str(next(iter(by_layer.values())).dtype).replace("torch.", ""),
                                estimator="published (reference layout)")
    lens = JacobianLens(settings, torch.stack([by_layer[l].float() for l in layers]), n_prompts)
    if model is not None:
        lens.check_model(model)
        if layers[-1] >= model.n_layers - 1:
            raise LensInputError(f"{path} has a matrix for layer {layers[-1]}, but {model.model_id} has "
                                 f"{model.n_layers} layers (the last, {model.n_layers - 1}, is the identity)")
        lens.settings = JacobianSettings(**{**asdict(settings), "model_id": model.model_id,
                                            "revision": getattr(model, "revision", "")})
    return lens
