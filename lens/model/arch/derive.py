"""Derive any transformers model's site map from its module tree and one probe forward pass.

1. The blocks are the ``ModuleList`` with ``num_hidden_layers`` entries (the text model's, in a
   multimodal model). ``embed`` / ``resid_pre`` / ``resid_post`` are a block's input and output.
2. Inside block 0, the probe's tensors decide the composition (:class:`lens.model.card.BlockKind`):
   * find ``a`` (an attention output, or the norm applied to it: sandwich norms) and ``m`` (an MLP
     or expert-mixture output, or its norm) with ``resid_post = resid_pre + a + m``;
   * ``resid_mid`` is the input of the first module that receives ``resid_pre + a`` — none in a
     parallel block, where the site is then absent;
   * post-norm encoders: ``resid_mid = norm1(resid_pre + attn_proj)``, ``resid_post = norm2(resid_mid + mlp_proj)``;
   * no such decomposition (state-space, recurrent, hybrid blocks): only the four residual sites.
3. Every tap found in block 0 must satisfy the same identity at every layer, or its site is absent.
4. The head: the final norm is the first module after the last block that receives its output; the
   modules after it up to the unembedding, a logit scale and soft cap, are kept only if decoding
   the last block's output reproduces the model's own logits on the probe.

Where the model cannot be run (weights on the meta device), only the residual sites and the final
norm are mapped from names, and the map says it is unverified.
"""

from __future__ import annotations

import contextlib

import logging

import torch
from torch import nn

from lens.model.arch import names as N
from lens.model.arch.probe import PaddingCheck, Trace, check_padding, run_probe, sequence_change
from lens.model.arch.site_map import Head, SiteMap
from lens.model.arch.taps import INPUT, OUTPUT, Tap, as_tokens
from lens.model.card import BlockKind, NormKind
from lens.errors import LensInputError
from lens.sites import Site

log = logging.getLogger(__name__)

MAX_DEPTH = 3  # how deep inside a block candidate modules are looked for


# ----------------------------------------------------------------------------- config facts
def text_config(model: nn.Module):
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def config_int(cfg, attrs) -> int | None:
    for a in attrs:
        v = getattr(cfg, a, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def n_layers_of(model: nn.Module) -> int:
    n = config_int(text_config(model), N.N_LAYER_ATTRS)
    if n is None:
        raise LensInputError(
            f"{type(model).__name__}: its config has no layer count (expected one of {', '.join(N.N_LAYER_ATTRS)})")
    return n


def d_model_of(model: nn.Module) -> int:
    cfg = text_config(model)
    for a in ("hidden_size", "d_model", "n_embd", "dim", "model_dim"):
        v = getattr(cfg, a, None)
        if isinstance(v, int) and v > 0:
            return v
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if emb is not None and hasattr(emb, "weight"):
        return int(emb.weight.shape[1])
    raise LensInputError(f"{type(model).__name__}: cannot tell the model width from its config")


def vocab_of(model: nn.Module) -> int:
    cfg = text_config(model)
    v = getattr(cfg, "vocab_size", None)
    if isinstance(v, int) and v > 0:
        return v
    emb = model.get_input_embeddings()
    return int(emb.weight.shape[0])


def is_causal_model(model: nn.Module) -> bool:
    """Decoders attend to the past only; masked-LM families are causal only when built as decoders."""
    from transformers.models.auto import modeling_auto as auto

    mt = getattr(model.config, "model_type", "")
    if mt in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return bool(getattr(text_config(model), "is_decoder", False))
    return True


# ----------------------------------------------------------------------------- module tree
def find_block_list(model: nn.Module, n_layers: int) -> str:
    """Path of the ModuleList of ``n_layers`` blocks (the text model's in a multimodal model)."""
    found = [(name, mod) for name, mod in model.named_modules()
             if isinstance(mod, nn.ModuleList) and len(mod) == n_layers and name]
    # drop lists nested inside another candidate's blocks (per-layer sub-lists)
    found = [(n, m) for n, m in found if not any(n != o and n.startswith(o + ".") for o, _ in found)]
    if not found:
        raise LensInputError(
            f"{getattr(model.config, 'model_type', '?')} ({type(model).__name__}): no ModuleList of "
            f"num_hidden_layers={n_layers} blocks in its module tree, so no site can be mapped "
            "(shared or looped layers are not supported)")

    def rank(item):
        name = item[0]
        other_modality = any(w in name for w in ("vision", "audio", "image", "visual", "speech"))
        return (other_modality, "encoder" in name and "decoder" not in name and _has_decoder(model), name.count("."))

    return sorted(found, key=rank)[0][0]


def _has_decoder(model) -> bool:
    return any(n.endswith("decoder") for n, _ in model.named_children())


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _cls(module: nn.Module) -> str:
    return type(module).__name__


def _is_norm(module: nn.Module) -> bool:
    """A normalisation module: ``nn.LayerNorm`` or a class named ``...Norm`` (``GemmaRMSNorm``,
    ``MambaRMSNormGated``) — not ``RobertaPreLayerNormAttention``, which only has it in its family name."""
    cls = _cls(module)
    if isinstance(module, (nn.LayerNorm, nn.GroupNorm)):
        return True
    # DBRX's ``DbrxNormAttentionNorm`` ends in "Norm" but holds the attention between its two norms
    return any(cls.endswith(p) for p in N.NORM_CLASS_SUFFIXES) and not any(p in cls for p in N.ATTENTION_CLASS_PARTS)


def _role(name: str, module: nn.Module) -> str:
    """attention / mlp / mixer / norm / other, from the child's name, then its class name."""
    if _is_norm(module):
        return "norm"
    if name in N.ATTENTION_NAMES and name not in N.MIXER_NAMES:
        return "attention"
    if name in N.MLP_NAMES:
        return "mlp"
    if name in N.MIXER_NAMES:
        return "mixer"
    cls = _cls(module)
    if any(p in cls for p in N.MIXER_CLASS_PARTS):
        return "mixer"
    if any(p in cls for p in N.ATTENTION_CLASS_PARTS):
        return "attention"
    if any(p in cls for p in N.MLP_CLASS_PARTS):
        return "mlp"
    return "other"


def _descendants(block: nn.Module, depth: int = MAX_DEPTH) -> list[str]:
    out = []
    for name, _ in block.named_modules():
        if name and name.count(".") < depth:
            out.append(name)
    return out


# ----------------------------------------------------------------------------- tensor identities
def _tol(x: torch.Tensor) -> float:
    return 1e-4 if x.dtype == torch.float32 or x.dtype == torch.float64 else 2e-2


def close(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """``a`` equals ``b`` up to the rounding of a different summation order. Non-finite entries (a
    model with an overflowing or NaN layer) must sit at the same places in both; the rest is compared."""
    if a is None or b is None or a.shape != b.shape or not a.is_floating_point():
        return False
    tol = max(_tol(a), _tol(b))  # the inputs' dtype decides (a bfloat16 model's sums round at 2^-8), not float32's
    a, b = a.float(), b.float()
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if not (fa.all() and fb.all()):
        if not torch.equal(fa, fb) or not fa.any():
            return False
        a, b = a[fa], b[fb]
    scale = float(b.abs().max()) + float(a.abs().max())
    return float((a - b).abs().max()) <= tol * (1.0 + scale)


def _nonzero(x: torch.Tensor, ref: torch.Tensor) -> bool:
    """A module's own output is zero or not whatever its dtype (the float32 threshold): a bfloat16 model's
    small random-weight MLP output is no rounding residue."""
    return float(x.float().abs().max()) > 1e-4 * (1.0 + float(ref.float().abs().max()))


class _Block:
    """The probe's view of one block: tensors of its descendants, (batch, seq, width)."""

    def __init__(self, trace: Trace, block_path: str, block: nn.Module, d: int):
        self.trace, self.path, self.module, self.d = trace, block_path, block, d
        rec = trace.get(block_path)
        self.X = rec.inp if rec else None
        self.Y = rec.out if rec else None
        self.start = rec.start if rec else -1
        self.rel = [r for r in _descendants(block) if trace.get(f"{block_path}.{r}") is not None]

    def rec(self, rel: str):
        return self.trace.get(f"{self.path}.{rel}")

    def out(self, rel: str) -> torch.Tensor | None:
        r = self.rec(rel)
        return self._shaped(r.out) if r is not None else None

    def inp(self, rel: str) -> torch.Tensor | None:
        r = self.rec(rel)
        return self._shaped(r.inp) if r is not None else None

    def _shaped(self, x):
        if x is None or not isinstance(x, torch.Tensor):
            return None
        x = as_tokens(x, self.trace.batch, self.trace.seq, True)
        if x.shape != (self.trace.batch, self.trace.seq, self.d):
            return None
        return x

    def order(self, rel: str) -> int:
        r = self.rec(rel)
        return r.start if r is not None else 10**12


def _candidates(blk: _Block, role: str) -> list[str]:
    """Block-relative paths whose output may be the ``role`` (attention / mlp) sub-block's output:
    the top-level child with that role, its norm when one is applied to it (sandwich), then its
    descendants (an output projection, when the sub-block adds the residual itself: BLOOM)."""
    tops = [n for n, m in blk.module.named_children() if _role(n, m) == role and blk.rec(n) is not None]
    tops.sort(key=blk.order)
    out: list[str] = []
    for top in tops:
        out.append(top)
        t_out = blk.out(top)
        for n, m in blk.module.named_children():
            if _is_norm(m) and t_out is not None and close(blk.inp(n), t_out):
                out.append(n)  # a norm applied to the sub-block's output: what is added is its output
        out.extend(r for r in blk.rel if r.startswith(top + ".") and isinstance(blk.module.get_submodule(r), nn.Linear))
    return [r for r in out if blk.out(r) is not None]


def _any_after(blk: _Block, rel: str) -> list[str]:
    """Outputs of modules that run after ``rel`` ends and are not inside it (an MLP spelled out as
    ``fc1`` / activation / ``fc2`` children of the block: OPT, BioGPT), in execution order."""
    end = blk.rec(rel).end
    return sorted((r for r in blk.rel if blk.rec(r).start > end and not r.startswith(rel + ".")
                   and blk.out(r) is not None), key=blk.order)


def _branch_pairs(blk: _Block):
    """``(attention rel, its output, MLP rel, its output)`` for every candidate pair of sub-blocks whose
    outputs are non-zero states of the block's shape (none when the block's input and output differ)."""
    X, Y = blk.X, blk.Y
    if X is None or Y is None or X.shape != Y.shape:
        return
    for a_rel in _candidates(blk, "attention"):
        a = blk.out(a_rel)
        if a is None or a.shape != X.shape or not _nonzero(a, X):
            continue
        for m_rel in _candidates(blk, "mlp") + _any_after(blk, a_rel):
            m = blk.out(m_rel)
            if m_rel != a_rel and m is not None and m.shape == X.shape and _nonzero(m, X):
                yield a_rel, a, m_rel, m


def _decompose(blk: _Block) -> dict | None:
    """Sequential / sandwich / parallel: taps (block-relative) for attn_out, mlp_out and resid_mid."""
    X, Y = blk.X, blk.Y
    for a_rel, a, m_rel, m in _branch_pairs(blk):
        if not close(X + a + m, Y):
            continue
        mid = X + a
        receivers = sorted((r for r in blk.rel if close(blk.inp(r), mid)), key=blk.order)
        a_is_norm = _is_norm(blk.module.get_submodule(a_rel))
        kind = BlockKind.PARALLEL if not receivers else (BlockKind.SANDWICH if a_is_norm else BlockKind.SEQUENTIAL)
        return {"kind": kind, "attn_out": (a_rel, OUTPUT), "mlp_out": (m_rel, OUTPUT),
                "resid_mid": (receivers[0], INPUT) if receivers else None}
    return None


def _plus(x: torch.Tensor | None, y: torch.Tensor | None) -> torch.Tensor | None:
    """``x + y`` where both are states of one shape (None otherwise: no broadcasting a head axis)."""
    return x + y if x is not None and y is not None and x.shape == y.shape else None


def _decompose_post_norm(blk: _Block) -> dict | None:
    """Post-norm (BERT): resid_mid = norm1(resid_pre + p1), resid_post = norm2(resid_mid + p2)."""
    X, Y = blk.X, blk.Y
    if X is None or Y is None:
        return None
    norms = [r for r in blk.rel if _is_norm(blk.module.get_submodule(r)) and blk.out(r) is not None]
    linears = [r for r in blk.rel if not _is_norm(blk.module.get_submodule(r)) and blk.out(r) is not None]
    for n2 in norms:
        if not close(blk.out(n2), Y):
            continue
        for n1 in norms:
            if blk.order(n1) >= blk.order(n2):
                continue
            mid = blk.out(n1)
            p1 = [p for p in linears if blk.order(p) < blk.order(n1) and close(blk.inp(n1), _plus(X, blk.out(p)))]
            p2 = [p for p in linears if blk.order(n1) < blk.order(p) < blk.order(n2)
                  and close(blk.inp(n2), _plus(mid, blk.out(p)))]
            if p1 and p2:
                return {"kind": BlockKind.POST_NORM, "attn_out": (p1[-1], OUTPUT), "mlp_out": (p2[-1], OUTPUT),
                        "resid_mid": (n1, OUTPUT)}
    return None


def _holds(blk: _Block, kind: BlockKind, taps: dict, branch: tuple | None = (1.0, 1.0)) -> str:
    """Empty when block ``blk`` satisfies the identity of ``kind`` with these taps (``branch``: the factors
    the attention and MLP outputs are added with), else why not."""
    def get(site):
        rel, k = taps[site]
        return blk.out(rel) if k == OUTPUT else blk.inp(rel)

    if branch is None:
        return f"{blk.path} does not return resid_pre + c·attn_out + c'·mlp_out for any factors c, c'"
    a, m = get("attn_out"), get("mlp_out")
    if a is not None and m is not None and branch != (1.0, 1.0):
        a, m = a * branch[0], m * branch[1]
    mid = get("resid_mid") if taps.get("resid_mid") else None
    if a is None or m is None or (taps.get("resid_mid") and mid is None):
        missing = [s for s in ("attn_out", "mlp_out", "resid_mid") if taps.get(s) and get(s) is None]
        return f"{', '.join(missing)} not found at {blk.path} ({', '.join(taps[s][0] for s in missing)})"
    X, Y = blk.X, blk.Y
    if kind is BlockKind.POST_NORM:
        return "" if close(mid + m, blk.inp(taps["_norm2"][0])) and close(blk.out(taps["_norm2"][0]), Y) else \
            f"{blk.path} is not norm(resid_mid + mlp_out)"
    if not close(X + a + m, Y):
        return f"{blk.path} does not return resid_pre + attn_out + mlp_out"
    if mid is not None and not close(mid, X + a):
        return f"{blk.path}: resid_mid is not resid_pre + attn_out"
    return ""


# ----------------------------------------------------------------------------- head and extras
def _norm_kind(norm: nn.Module, x: torch.Tensor | None, y: torch.Tensor | None) -> tuple[NormKind | None, float]:
    """RMS or layer norm, with a ``w`` or ``1 + w`` gain (Gemma), decided on the probe's tensors."""
    w = getattr(norm, "weight", None)
    b = getattr(norm, "bias", None)
    eps = next((float(getattr(norm, a)) for a in ("eps", "variance_epsilon", "epsilon")
                if isinstance(getattr(norm, a, None), (int, float))), 1e-6)
    if x is not None and y is not None and x.shape == y.shape:
        tol = 1e-3 if y.dtype in (torch.float32, torch.float64) else 2e-2  # a bfloat16 norm rounds its output
        xf = x.float()
        bases = {
            NormKind.RMS: xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps),
            NormKind.LAYER: (xf - xf.mean(-1, keepdim=True)) * torch.rsqrt(xf.var(-1, keepdim=True, unbiased=False) + eps),
        }
        for kind, base in bases.items():
            for offset in (0.0, 1.0):
                gain = (w.float() + offset) if isinstance(w, torch.Tensor) else 1.0 + offset * 0
                pred = base * gain + (b.float() if isinstance(b, torch.Tensor) else 0.0)
                if float((pred - y.float()).abs().max()) <= tol * (1 + float(y.float().abs().max())):
                    return kind, offset if isinstance(w, torch.Tensor) else 0.0
    cls = _cls(norm)
    if "RMS" in cls or "Rms" in cls:
        return NormKind.RMS, 0.0
    if isinstance(norm, nn.LayerNorm) or "LayerNorm" in cls:
        return NormKind.LAYER, 0.0
    return None, 0.0


def _logit_factors(cfg) -> tuple[list[float | None], list[float]]:
    caps: list[float | None] = [None]
    for a in N.SOFTCAP_ATTRS:
        v = getattr(cfg, a, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            caps.append(float(v))
    scales = [1.0]
    for a in N.LOGIT_SCALE_ATTRS:
        v = getattr(cfg, a, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v not in (0, 1):
            scales += [float(v), 1.0 / float(v)]
    return caps, scales


def apply_logit_factors(logits: torch.Tensor, scale: float, softcap: float | None) -> torch.Tensor:
    if scale != 1.0:
        logits = logits * scale
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def _around(model: nn.Module, path: str) -> list[str]:
    """Children of every ancestor of ``path`` (the final norm may sit in the base model, in an encoder
    wrapper, or beside it), except the ancestors themselves."""
    parts = path.split(".")
    ancestors = [".".join(parts[:i]) for i in range(len(parts))]
    out = []
    for anc in ancestors:
        mod = model.get_submodule(anc) if anc else model
        if isinstance(mod, nn.ModuleList):  # the other blocks
            continue
        for name, _ in mod.named_children():
            child = f"{anc}.{name}" if anc else name
            if child not in ancestors and not path.startswith(child + "."):
                out.append(child)
    return out


def _derive_head(model: nn.Module, trace: Trace, base: str, last_block: str, cfg, scale: float = 1.0) -> Head:
    emb_out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    paths = {id(m): n for n, m in model.named_modules()}
    unembed = paths.get(id(emb_out)) if emb_out is not None else None
    last = trace.get(last_block)
    after = []
    for path in _around(model, last_block):
        rec = trace.get(path)
        if rec is not None and last is not None and rec.start > last.end and path != unembed:
            after.append((rec.start, path, model.get_submodule(path)))
    after.sort(key=lambda t: t[0])
    norm_path, norm_kind, offset, chain = None, None, 0.0, []
    cur = (last.out * scale if scale != 1.0 else last.out) if last is not None else None
    for _, path, mod in after:
        rec = trace.get(path)
        if not close(rec.inp, cur):
            continue
        if norm_path is None and not chain and _is_norm(mod):
            norm_path = path
            norm_kind, offset = _norm_kind(mod, rec.inp, rec.out)
        elif not _is_norm(mod):
            chain.append(path)
        cur = rec.out
    if unembed is None:
        return Head(norm=norm_path, norm_kind=norm_kind, norm_offset=offset,
                    why_not="the model has no output embedding (an encoder or a base model without its LM head)")
    if trace.logits is None:
        why = f"the probe forward failed ({trace.error})" if trace.error else "the model returned no logits"
        return Head(norm=norm_path, chain=tuple(chain), unembed=unembed, norm_kind=norm_kind, norm_offset=offset,
                    why_not=why)
    head_rec = trace.get(unembed)
    raw = head_rec.out if head_rec is not None else None
    pre = _pre_unembed_factor(model.get_submodule(unembed), cur, head_rec)
    if raw is None or pre is None:
        return Head(norm=norm_path, chain=tuple(chain), unembed=unembed, norm_kind=norm_kind, norm_offset=offset,
                    why_not="the unembedding does not receive the final norm's output: other modules stand between")
    # no final norm (a post-norm decoder such as GPT-1: every block ends in its own norm): the model's own
    # head is the unembedding alone, verified below like any other
    exact = trace.logits.dtype in (torch.float32, torch.float64)  # else a bfloat16 / float16 model's logits
    logits = trace.logits.float()
    caps, scales = _logit_factors(cfg)
    if pre != 1.0:  # the lens unembeds the final norm's output: what the unembedding gives for it is raw / pre
        raw, scales = raw.float() / pre, [*scales, pre]
    best = None
    for cap in caps:
        for s in scales:
            pred = apply_logit_factors(raw.float(), s, cap)
            if pred.shape != logits.shape:
                continue
            diff = float((pred - logits).abs().max())
            if best is None or diff < best[0]:
                best = (diff, s, cap)
    if best is None:
        return Head(norm=norm_path, chain=tuple(chain), unembed=unembed, norm_kind=norm_kind, norm_offset=offset,
                    why_not=f"the unembedding's output shape {tuple(raw.shape)} is not the logits' {tuple(logits.shape)}")
    diff, s, cap = best
    ok = diff <= 1e-4 * (1.0 + float(logits.abs().max())) if exact else diff <= 0.05 * (
        1.0 + float(logits.abs().max()))
    return Head(norm=norm_path, chain=tuple(chain), unembed=unembed, norm_kind=norm_kind, norm_offset=offset,
                softcap=cap, scale=s, verified=ok, max_diff=diff,
                why_not="" if ok else f"decoding the last block's output does not reproduce the logits (max |diff| {diff:.3g})")


def _position(model: nn.Module, cfg) -> str:
    mt = getattr(cfg, "model_type", "")
    if mt in N.ALIBI_MODEL_TYPES or any(getattr(cfg, a, False) is True for a in N.ALIBI_ATTRS):
        return "alibi"
    for name, mod in model.named_modules():
        leaf = name.rpartition(".")[2]
        if leaf in N.POSITION_EMBEDDING_NAMES and (isinstance(mod, nn.Embedding) or "Position" in _cls(mod)):
            return "learned"
    for name, mod in model.named_modules():
        if name.rpartition(".")[2] in N.ROTARY_NAMES or "Rotary" in _cls(mod):
            return "rotary"
    if any(getattr(cfg, a, None) is not None for a in N.ROPE_ATTRS):
        return "rotary"
    return "none"


def _embed_scale(model: nn.Module, trace: Trace, first_block: str) -> float | None:
    """The factor between the token-embedding table and block 0's input, when it is one (Gemma's √d)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rec_b = trace.get(first_block)
    weight = getattr(emb, "weight", None)
    if rec_b is None or rec_b.inp is None or trace.ids is None or not isinstance(weight, torch.Tensor):
        return None
    e = nn.functional.embedding(trace.ids, weight).float()
    x = rec_b.inp.float()
    if e.shape != x.shape:
        return None
    denom = float((e * e).sum())
    if denom == 0:
        return None
    s = float((e * x).sum()) / denom
    if abs(s - 1.0) < 1e-4 or not close(e * s, x):
        return None
    return s


def _router(model: nn.Module, trace: Trace, layers: str, n_layers: int, mlp_rel: str | None, n_experts: int,
            batch: int, seq: int) -> tuple[Tap | None, list[int], str]:
    """The router-logits tap of mixture-of-experts blocks: a ``gate`` / ``router`` child of the MLP
    whose first output is (batch·seq, n_experts) real-valued logits (not probabilities)."""
    if not mlp_rel or n_experts <= 0:
        return None, [], "a dense MLP has no router"
    found: dict[int, str] = {}
    for l in range(n_layers):
        for name in N.ROUTER_NAMES:
            rec = trace.get(f"{layers}.{l}.{mlp_rel}.{name}")
            if rec is None or not isinstance(rec.out, torch.Tensor) or not rec.out.is_floating_point():
                continue
            x = as_tokens(rec.out, batch, seq, True)
            if x.shape != (batch, seq, n_experts):
                continue
            probs = bool((x >= 0).all()) and torch.allclose(x.float().sum(-1), torch.ones(()), atol=1e-3)
            if not probs:
                found[l] = name
                break
    if not found:
        return None, [], "no router child of the MLP returns (token, n_experts) logits"
    names = set(found.values())
    if len(names) > 1:
        return None, [], f"router children differ across layers ({', '.join(sorted(names))})"
    name = names.pop()
    why = "" if len(found) == n_layers else "those layers have a dense MLP"
    return Tap(f"{layers}.{{l}}.{mlp_rel}.{name}", OUTPUT, flat_tokens=True), sorted(found), why


# ----------------------------------------------------------------------------- entry point
@contextlib.contextmanager
def _finite_weights(model: nn.Module):
    """Set the model's NaN / inf weights to 0 for the probe forward (the site map is a fact about the
    module tree, and non-finite states would hide every identity it checks); restore them after.
    Yields how many there were."""
    saved = []
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point() and not p.is_meta:
                bad = ~torch.isfinite(p)
                if bad.any():
                    saved.append((p, bad, p[bad].clone()))
                    p[bad] = 0
    try:
        yield sum(int(b.sum()) for _, b, _ in saved)
    finally:
        with torch.no_grad():
            for p, bad, values in saved:
                p[bad] = values


def derive_site_map(model: nn.Module, *, probe: bool = True) -> SiteMap:
    """The site map of a transformers model (see the module docstring)."""
    cfg = text_config(model)
    model_type = str(getattr(model.config, "model_type", "") or type(model).__name__)
    L = n_layers_of(model)
    d = d_model_of(model)
    dec = getattr(cfg, "decoder_layers", None)
    if isinstance(dec, int) and dec != L and not _lists_of(model, L):  # decoder-only wrapper of an encoder-decoder
        L = dec
    layers = find_block_list(model, L)
    base = _parent(layers)
    blocks = model.get_submodule(layers)
    # weights offloaded by accelerate (hf_device_map) are on the meta device between forwards, yet the model runs
    meta = any(p.is_meta for p in model.parameters()) and not getattr(model, "hf_device_map", None)
    n_experts = config_int(cfg, N.N_EXPERT_ATTRS) or 0
    common = {
        Site.EMBED: Tap(f"{layers}.0", INPUT),
        Site.RESID_PRE: Tap(f"{layers}.{{l}}", INPUT),
        Site.RESID_POST: Tap(f"{layers}.{{l}}", OUTPUT),
    }
    kw = dict(model_type=model_type, architecture=type(model).__name__, layers=layers, n_layers=L,
              position=_position(model, cfg), is_causal=is_causal_model(model))
    if meta or not probe:
        return _unverified(model, common, kw, base, "the weights are not loaded (meta device)" if meta else
                           "derived without a probe forward")

    with _finite_weights(model) as n_bad:
        trace = run_probe(model, _watch_list(model, layers, blocks, L), vocab_of(model))
        padding = _padding(model, layers, L) if not trace.error else PaddingCheck(None)
    _refuse_pooling(trace, layers, d, model)
    if trace.error or trace.get(f"{layers}.0") is None:
        why = f"the probe forward failed ({trace.error})" if trace.error else "block 0 never ran"
        return _unverified(model, common, kw, base, why)

    views = [_Block(trace, f"{layers}.{l}", blocks[l], d) for l in range(L)]
    between = [_stream_scale(views[l].Y, views[l + 1].X) for l in range(L - 1)]
    broken = next((l for l in range(L - 1) if between[l] is None), None)
    if broken is not None or views[0].X is None or views[0].X.shape[-1] != d:
        raise LensInputError(
            f"{model_type} ({type(model).__name__}): the modules in {layers} do not form a residual stream "
            + (f"(block {broken + 1} does not receive block {broken}'s output)" if broken is not None else
               f"(block 0 does not receive a (batch, seq, {d}) state)")
            + ", so resid_pre / resid_post cannot be mapped; this family is not supported")
    if views[0].X.dim() > 3:  # hyper-connections (DeepSeek V4): several residual streams per token
        raise LensInputError(
            f"{model_type} ({type(model).__name__}): its blocks pass a {tuple(views[0].X.shape)} state, several "
            f"residual streams of width {d} per token, not one (batch, seq, {d}) residual stream, so resid_pre / "
            "resid_post cannot be mapped to one state per token; this family is not supported")
    notes: list[str] = list(_padding_notes(padding))
    if n_bad:
        notes.append(f"{n_bad} weights are NaN or inf: the probe forward that maps the sites ran with them set "
                     "to 0 (restored after); captures record the non-finite states they cause")
    taps = dict(common)
    absent: dict = {}
    site_layers: dict = {}
    scales: dict = {}
    kind, decomposed = _map_block_sites(model, trace, layers, blocks, views, n_experts, taps, absent, site_layers,
                                        scales, notes)
    order = _order_in_block(views, taps, site_layers)
    last_scale = _last_scale(model, trace, f"{layers}.{L - 1}")
    if any(b != 1.0 for b in between) or last_scale != 1.0:
        scales[Site.RESID_POST] = tuple(between) + (last_scale,)
        notes.append("the residual stream is rescaled between blocks: resid_post is a block's output times "
                     "its layer's scale, the state the next block (or the final norm) receives")
    if Site.ATTN_OUT in scales:
        notes.append("attn_out / mlp_out are the sub-blocks' outputs times their scale, as added to the stream")
    head = _derive_head(model, trace, base, f"{layers}.{L - 1}", cfg, last_scale)
    if head.norm is not None:
        taps[Site.FINAL_NORM] = Tap(head.norm, OUTPUT)
    else:
        absent[Site.FINAL_NORM] = ("post-norm blocks: every block ends in its own norm, there is no final norm"
                                   if kind is BlockKind.POST_NORM else "no norm runs on the last block's output")
    return SiteMap(block=kind, taps=taps, absent=absent, head=head, site_layers=site_layers, verified=True, order=order,
                   notes=tuple(notes), embed_scale=_embed_scale(model, trace, f"{layers}.0"),
                   padding_invariant=padding.invariant, padding_max_rel=padding.max_rel, scales=scales,
                   n_experts=n_experts if Site.ROUTER_LOGITS in taps else (n_experts if decomposed else 0), **kw)


def _watch_list(model: nn.Module, layers: str, blocks, L: int) -> list[str]:
    """The modules the probe forward records: every block and everything inside it, what runs after the
    last block, and the input and output embeddings."""
    watch = [layers + f".{l}" for l in range(L)]
    for l in range(L):
        watch += [f"{layers}.{l}.{r}" for r in _descendants(blocks[l])]
    watch += _around(model, f"{layers}.{L - 1}")
    paths = {id(m): n for n, m in model.named_modules()}
    for m in (model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None,
              model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None):
        if m is not None and id(m) in paths:
            watch.append(paths[id(m)])
    return list(dict.fromkeys(watch))


def _map_block_sites(model: nn.Module, trace, layers: str, blocks, views: list, n_experts: int, taps: dict,
                     absent: dict, site_layers: dict, scales: dict, notes: list) -> tuple[BlockKind, bool]:
    """The sites inside a block (resid_mid, attn_out, mlp_out, router_logits) into ``taps`` (their scales into
    ``scales``), or why not into ``absent``, from block 0's decomposition checked at every layer; returns the
    block kind and whether block 0 decomposed at all."""
    L = len(views)
    parts = _decompose(views[0]) or _decompose_post_norm(views[0]) or _decompose_scaled(views[0])
    kind = parts["kind"] if parts else BlockKind.RECURRENT
    sub_sites = (Site.RESID_MID, Site.ATTN_OUT, Site.MLP_OUT)
    if parts is None:
        why = ("a recurrent / state-space / hybrid block has no attention + MLP decomposition: "
               "resid_post is not resid_pre plus an attention output plus an MLP output (a block that scales "
               "its sub-block outputs before adding them, as MiniCPM does, is read the same way)")
        absent.update({s: why for s in sub_sites})
        absent[Site.ROUTER_LOGITS] = why
    else:
        rel = {s: parts[s] for s in ("attn_out", "mlp_out", "resid_mid") if parts[s]}
        if kind is BlockKind.POST_NORM:
            n2 = next(r for r in views[0].rel if _is_norm(blocks[0].get_submodule(r)) and close(views[0].out(r), views[0].Y))
            rel["_norm2"] = (n2, OUTPUT)
        branch = [_branch_scales(v, rel) if parts.get("scaled") else (1.0, 1.0) for v in views]
        failures = [w for w in (_holds(v, kind, rel, b) for v, b in zip(views, branch)) if w]
        if failures:
            why = f"the block decomposition of layer 0 does not hold at every layer ({failures[0]})"
            absent.update({s: why for s in sub_sites})
            absent[Site.ROUTER_LOGITS] = why
            notes.append(f"layer 0 looks {kind.value}, but {failures[0]}: only the residual sites are mapped")
            kind = BlockKind.RECURRENT
        else:
            for site in sub_sites:
                if rel.get(site.value):
                    r, k = rel[site.value]
                    raw = views[0].rec(r).inp if k == INPUT else views[0].rec(r).out
                    # a module that sees tokens flattened to (batch·seq, d) (Llama 4's MoE) is unflattened
                    taps[site] = Tap(f"{layers}.{{l}}.{r}", k, flat_tokens=raw is not None and raw.dim() == 2)
            if parts.get("scaled"):
                scales[Site.ATTN_OUT] = tuple(b[0] for b in branch)
                scales[Site.MLP_OUT] = tuple(b[1] for b in branch)
            if Site.RESID_MID not in taps:
                absent[Site.RESID_MID] = ("attention and MLP run in parallel on the same input: no state exists "
                                          "after attention and before the MLP")
            mlp_rel = rel["mlp_out"][0].split(".")[0]
            router, router_layers, why = _router(model, trace, layers, L, mlp_rel, n_experts, trace.batch, trace.seq)
            if router is not None:
                taps[Site.ROUTER_LOGITS] = router
                if len(router_layers) < L:
                    site_layers[Site.ROUTER_LOGITS] = tuple(router_layers)
                    absent[Site.ROUTER_LOGITS] = why
            else:
                absent[Site.ROUTER_LOGITS] = why
    return kind, parts is not None


def _padding(model: nn.Module, layers: str, L: int) -> PaddingCheck:
    """The probe's padding check (:func:`lens.model.arch.probe.check_padding`) on every block's output."""
    pad = getattr(text_config(model), "pad_token_id", None)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    tol = 1e-4 if dtype in (torch.float32, torch.float64) else 2e-2
    return check_padding(model, [f"{layers}.{l}" for l in range(L)], vocab_of(model),
                         pad if isinstance(pad, int) and 0 <= pad < vocab_of(model) else 0, tol)


def _padding_notes(padding: PaddingCheck) -> list[str]:
    if padding.invariant is False:
        return [f"not padding-invariant: a padded row's states differ from its unpadded forward (relative "
                f"{padding.max_rel:.2g} at {padding.where}); windows are captured without padding (a batch runs "
                "its windows of equal length together)"]
    if padding.invariant is None and padding.error:
        return [f"padding invariance not checked ({padding.error}): windows are batched with padding"]
    return []


def _pre_unembed_factor(unembed: nn.Module, cur, head_rec) -> float | None:
    """1.0 when the unembedding receives ``cur`` (the final norm's output); the factor when it receives a
    multiple of it and is linear without a bias (MiniCPM divides by ``logits_scaling`` first: the same as
    dividing the logits); None otherwise."""
    if head_rec is None:
        return None
    if close(head_rec.inp, cur):
        return 1.0
    if getattr(unembed, "bias", None) is not None or not isinstance(unembed, nn.Linear):
        return None
    return _stream_scale(cur, head_rec.inp)


def _stream_scale(y: torch.Tensor | None, x: torch.Tensor | None) -> float | None:
    """The factor ``s`` with ``x = s · y`` (1.0 when ``x`` is ``y``): a block's output ``y`` and what the
    next block (or the final norm) receives, ``x``. RWKV halves its stream every ``rescale_every`` blocks.
    None when ``x`` is no multiple of ``y``."""
    if y is None or x is None:
        return None
    if close(x, y):
        return 1.0
    if x.shape != y.shape or not x.is_floating_point():
        return None
    yf, xf = y.float(), x.float()
    ok = torch.isfinite(yf) & torch.isfinite(xf)
    denom = float((yf[ok] * yf[ok]).sum())
    if denom == 0:
        return None
    s = float((yf[ok] * xf[ok]).sum()) / denom
    return s if s != 0 and close(x, y * s) else None


def _last_scale(model: nn.Module, trace: Trace, last_block: str) -> float:
    """The factor between the last block's output and the first module after the blocks that receives a
    multiple of it (RWKV halves it before ``ln_out`` when the layer count is a multiple of ``rescale_every``)."""
    last = trace.get(last_block)
    if last is None or last.out is None:
        return 1.0
    after = sorted((trace.get(p).start, p) for p in _around(model, last_block)
                   if trace.get(p) is not None and trace.get(p).start > last.end)
    for _, p in after:
        s = _stream_scale(last.out, trace.get(p).inp)
        if s is not None:
            return s
    return 1.0


def _fit_branches(X, Y, a, m) -> tuple[float, float] | None:
    """Factors (c, c') with ``Y = X + c·a + c'·m`` (least squares, then checked), None when there are none."""
    if any(t is None or t.shape != X.shape for t in (Y, a, m)):
        return None
    A = torch.stack([a.float().reshape(-1), m.float().reshape(-1)], dim=1).double()
    r = (Y.float() - X.float()).reshape(-1).double()
    try:
        c = torch.linalg.lstsq(A, r[:, None]).solution.flatten()
    except RuntimeError:
        return None
    ca, cm = float(c[0]), float(c[1])
    if not (abs(ca) > 1e-6 and abs(cm) > 1e-6) or not close(X + a * ca + m * cm, Y):
        return None
    return ca, cm


def _decompose_scaled(blk: _Block) -> dict | None:
    """A sequential block that adds its sub-blocks' outputs times a factor (MiniCPM:
    ``h += c · attn(norm(h)); h += c · mlp(norm(h))``, ``c = scale_depth / sqrt(n_layers)``)."""
    X, Y = blk.X, blk.Y
    for a_rel, a, m_rel, m in _branch_pairs(blk):
        fit = _fit_branches(X, Y, a, m)
        if fit is None:
            continue
        mid = X + a * fit[0]
        receivers = sorted((r for r in blk.rel if close(blk.inp(r), mid)), key=blk.order)
        kind = BlockKind.SEQUENTIAL if receivers else BlockKind.PARALLEL
        return {"kind": kind, "attn_out": (a_rel, OUTPUT), "mlp_out": (m_rel, OUTPUT),
                "resid_mid": (receivers[0], INPUT) if receivers else None, "scaled": True}
    return None


def _branch_scales(blk: _Block, taps: dict) -> tuple[float, float] | None:
    """This block's factors for its attention and MLP outputs (see :func:`_fit_branches`)."""
    a, m = blk.out(taps["attn_out"][0]), blk.out(taps["mlp_out"][0])
    return _fit_branches(blk.X, blk.Y, a, m)


def _refuse_pooling(trace: Trace, layers: str, d: int, model: nn.Module) -> None:
    """A family whose blocks pool (or otherwise change) the sequence has no state per input token at
    every layer: refused by name, on what the probe saw, before any site is mapped."""
    where = sequence_change(trace, layers, d)
    if where:
        mt = str(getattr(model.config, "model_type", "") or type(model).__name__)
        raise LensInputError(
            f"{mt} ({type(model).__name__}) pools or reorders the sequence between its blocks ({where}): its "
            "layers do not hold one state per input token, so no site can be stored per token; this family is "
            "not supported")


def _order_in_block(views: list, taps: dict, site_layers: dict) -> dict:
    """When a block reaches each per-layer site: an input when its module starts, an output when it
    ends, read in one block where every site exists (a MoE layer, when some layers are dense)."""
    per_layer = {s: t for s, t in taps.items() if s.per_layer}
    layers = set(range(len(views)))
    for site in per_layer:
        layers &= set(site_layers.get(site, range(len(views))))
    if not layers:
        return {}
    ref = min(layers)
    blk = views[ref]
    order = {}
    for site, tap in per_layer.items():
        rec = blk.trace.get(tap.at(ref))
        if rec is not None:
            order[site] = (rec.start if tap.kind == INPUT else rec.end) - blk.start
    return order


def _unverified(model, common: dict, kw: dict, base: str, why: str) -> SiteMap:
    """Residual sites only (they are block inputs and outputs by definition), and a final norm by name."""
    taps = dict(common)
    absent = {s: f"not verified: {why}" for s in (Site.RESID_MID, Site.ATTN_OUT, Site.MLP_OUT, Site.ROUTER_LOGITS)}
    base_mod = model.get_submodule(base) if base else model
    norms = [n for n, m in base_mod.named_children() if _is_norm(m)]
    head = Head(why_not=f"not verified: {why}")
    if len(norms) == 1:
        path = f"{base}.{norms[0]}" if base else norms[0]
        taps[Site.FINAL_NORM] = Tap(path, OUTPUT)
        head = Head(norm=path, why_not=f"not verified: {why}")
    else:
        absent[Site.FINAL_NORM] = f"not verified: {why}"
    return SiteMap(block=BlockKind.UNVERIFIED, taps=taps, absent=absent, head=head, verified=False,
                   notes=(f"unverified map: {why}",), **kw)
