"""Inside a block: which modules' outputs add up to the block's output (the block kind and the taps of
``resid_mid``, ``attn_out``, ``mlp_out``, ``router_logits``), checked at every layer, and when in a
block each site is reached."""

from __future__ import annotations

import torch
from torch import nn

from lens.model.arch import names as N
from lens.model.arch.identities import close, is_nonzero, plus
from lens.model.arch.probe import Trace
from lens.model.arch.taps import INPUT, OUTPUT, Tap, as_tokens
from lens.model.arch.tree import child_role, descendants, is_norm
from lens.model.card import BlockKind
from lens.sites import Site


class BlockView:
    """The probe's view of one block: tensors of its descendants, (batch, seq, width)."""

    def __init__(self, trace: Trace, block_path: str, block: nn.Module, d: int):
        self.trace, self.path, self.module, self.d = trace, block_path, block, d
        rec = trace.get(block_path)
        self.X = rec.inp if rec else None
        self.Y = rec.out if rec else None
        self.start = rec.start if rec else -1
        self.rel = [r for r in descendants(block) if trace.get(f"{block_path}.{r}") is not None]

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


def _candidates(blk: BlockView, role: str) -> list[str]:
    """Block-relative paths whose output may be the ``role`` (attention / mlp) sub-block's output:
    the top-level child with that role, its norm when one is applied to it (sandwich), then its
    descendants (an output projection, when the sub-block adds the residual itself: BLOOM)."""
    tops = [n for n, m in blk.module.named_children() if child_role(n, m) == role and blk.rec(n) is not None]
    tops.sort(key=blk.order)
    out: list[str] = []
    for top in tops:
        out.append(top)
        t_out = blk.out(top)
        for n, m in blk.module.named_children():
            if is_norm(m) and t_out is not None and close(blk.inp(n), t_out):
                out.append(n)  # a norm applied to the sub-block's output: what is added is its output
        out.extend(r for r in blk.rel if r.startswith(top + ".") and isinstance(blk.module.get_submodule(r), nn.Linear))
    return [r for r in out if blk.out(r) is not None]


def _any_after(blk: BlockView, rel: str) -> list[str]:
    """Outputs of modules that run after ``rel`` ends and are not inside it (an MLP spelled out as
    ``fc1`` / activation / ``fc2`` children of the block: OPT, BioGPT), in execution order."""
    end = blk.rec(rel).end
    return sorted((r for r in blk.rel if blk.rec(r).start > end and not r.startswith(rel + ".")
                   and blk.out(r) is not None), key=blk.order)


def _branch_pairs(blk: BlockView):
    """``(attention rel, its output, MLP rel, its output)`` for every candidate pair of sub-blocks whose
    outputs are non-zero states of the block's shape (none when the block's input and output differ)."""
    X, Y = blk.X, blk.Y
    if X is None or Y is None or X.shape != Y.shape:
        return
    for a_rel in _candidates(blk, "attention"):
        a = blk.out(a_rel)
        if a is None or a.shape != X.shape or not is_nonzero(a, X):
            continue
        for m_rel in _candidates(blk, "mlp") + _any_after(blk, a_rel):
            m = blk.out(m_rel)
            if m_rel != a_rel and m is not None and m.shape == X.shape and is_nonzero(m, X):
                yield a_rel, a, m_rel, m


def _decompose(blk: BlockView) -> dict | None:
    """Sequential / sandwich / parallel: taps (block-relative) for attn_out, mlp_out and resid_mid."""
    X, Y = blk.X, blk.Y
    for a_rel, a, m_rel, m in _branch_pairs(blk):
        if not close(X + a + m, Y):
            continue
        mid = X + a
        receivers = sorted((r for r in blk.rel if close(blk.inp(r), mid)), key=blk.order)
        a_is_norm = is_norm(blk.module.get_submodule(a_rel))
        kind = BlockKind.PARALLEL if not receivers else (BlockKind.SANDWICH if a_is_norm else BlockKind.SEQUENTIAL)
        return {"kind": kind, "attn_out": (a_rel, OUTPUT), "mlp_out": (m_rel, OUTPUT),
                "resid_mid": (receivers[0], INPUT) if receivers else None}
    return None


def _decompose_post_norm(blk: BlockView) -> dict | None:
    """Post-norm (BERT): resid_mid = norm1(resid_pre + p1), resid_post = norm2(resid_mid + p2)."""
    X, Y = blk.X, blk.Y
    if X is None or Y is None:
        return None
    norms = [r for r in blk.rel if is_norm(blk.module.get_submodule(r)) and blk.out(r) is not None]
    linears = [r for r in blk.rel if not is_norm(blk.module.get_submodule(r)) and blk.out(r) is not None]
    for n2 in norms:
        if not close(blk.out(n2), Y):
            continue
        for n1 in norms:
            if blk.order(n1) >= blk.order(n2):
                continue
            mid = blk.out(n1)
            p1 = [p for p in linears if blk.order(p) < blk.order(n1) and close(blk.inp(n1), plus(X, blk.out(p)))]
            p2 = [p for p in linears if blk.order(n1) < blk.order(p) < blk.order(n2)
                  and close(blk.inp(n2), plus(mid, blk.out(p)))]
            if p1 and p2:
                return {"kind": BlockKind.POST_NORM, "attn_out": (p1[-1], OUTPUT), "mlp_out": (p2[-1], OUTPUT),
                        "resid_mid": (n1, OUTPUT)}
    return None


def _holds(blk: BlockView, kind: BlockKind, taps: dict, branch: tuple | None = (1.0, 1.0)) -> str:
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


def _decompose_scaled(blk: BlockView) -> dict | None:
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


def _branch_scales(blk: BlockView, taps: dict) -> tuple[float, float] | None:
    """This block's factors for its attention and MLP outputs (see :func:`_fit_branches`)."""
    a, m = blk.out(taps["attn_out"][0]), blk.out(taps["mlp_out"][0])
    return _fit_branches(blk.X, blk.Y, a, m)


def map_block_sites(model: nn.Module, trace, layers: str, blocks, views: list, n_experts: int, taps: dict,
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
            n2 = next(r for r in views[0].rel if is_norm(blocks[0].get_submodule(r)) and close(views[0].out(r), views[0].Y))
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


def order_in_block(views: list, taps: dict, site_layers: dict) -> dict:
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
