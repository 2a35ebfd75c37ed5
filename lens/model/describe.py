"""What ``lens inspect MODEL`` shows: the model's site map and the facts an analysis depends on.

:func:`describe` returns a plain dict (also what ``--json`` prints); :func:`format_description`
turns it into the text a researcher reads first when meeting a new model.
"""

from __future__ import annotations

from lens.sites import Site


def describe(model) -> dict:
    """Site map (site -> module path with ``{l}`` and tap), absent sites with reasons, and facts."""
    sm = model.site_map
    card = model.card()
    sites = {}
    for site in Site:
        tap = sm.taps.get(site)
        if tap is None:
            continue
        layers = sm.layers_of(site) if site.per_layer else None
        sites[site.value] = {"module": tap.path, "tap": tap.kind, "layers": _span(layers)}
    head = sm.head
    return {
        "model": model.model_id,
        "model_type": sm.model_type,
        "architecture": sm.architecture,
        "block": sm.block.value,
        "verified": sm.verified,
        "n_layers": card.n_layers,
        "d_model": card.d_model,
        "d_vocab": card.d_vocab,
        "n_params": card.n_params,
        "dtype": card.dtype,
        "causal": card.is_causal,
        "blocks": sm.layers,
        "sites": sites,
        "absent": {s.value: why for s, why in sm.absent.items() if s not in sm.taps or s in sm.site_layers},
        "final_norm": {"module": head.norm, "kind": None if head.norm_kind is None else head.norm_kind.value,
                       "gain": "1 + w" if head.norm_offset else "w"} if head.norm else None,
        "lm_head": {"module": head.unembed, "between": list(head.chain), "logit_scale": head.scale,
                    "softcap": head.softcap, "tied": card.tied_embeddings,
                    "lens_reproduces_logits": head.usable, "max_abs_diff": head.max_diff,
                    "why_not": head.why_not},
        "position": sm.position,
        "embed_scale": sm.embed_scale,
        "n_experts": sm.n_experts,
        "padding_invariant": sm.padding_invariant,
        "scales": {s.value: list(v) for s, v in sm.scales.items()},
        "padding_max_rel": sm.padding_max_rel,
        "notes": list(sm.notes),
    }


def _span(layers):
    if layers is None:
        return "-"
    if not layers:
        return "none"
    if layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else str(layers[0])
    return ",".join(map(str, layers))


def format_description(d: dict) -> str:
    lines = [
        f"model        {d['model']}  ({d['model_type']}, {d['architecture']})",
        f"shape        {d['n_layers']} layers x d_model {d['d_model']}, vocab {d['d_vocab']}, "
        f"{d['n_params'] / 1e6:.2f} M parameters, {d['dtype']}",
        f"blocks       {d['blocks']}: {d['block']}{'' if d['verified'] else ' (NOT verified on a forward pass)'}",
        f"attention    {'causal' if d['causal'] else 'bidirectional'}; positions: {d['position']}"
        + (f"; embeddings scaled by {d['embed_scale']:.4g}" if d["embed_scale"] else ""),
    ]
    pad = d.get("padding_invariant")
    lines.append("padding      " + ("invariant (a padded row = its unpadded forward"
                                    + (f", relative {d['padding_max_rel']:.1g})" if d.get("padding_max_rel") is not None else ")")
                                    if pad else "NOT invariant: captured without padding (windows of equal length "
                                    "batched together)" if pad is False else "not checked: batched with padding"))
    for site, per_layer in (d.get("scales") or {}).items():
        lines.append(f"scaled       {site} x " + ", ".join(f"{v:.4g}" for v in per_layer) + " (per layer, as the "
                     "stream receives it)")
    if d["n_experts"]:
        lines.append(f"experts      {d['n_experts']} per MoE layer (mlp_out = combined expert output)")
    fn = d["final_norm"]
    lines.append(f"final norm   {fn['module']} ({fn['kind'] or 'unknown kind'}, gain {fn['gain']})" if fn
                 else "final norm   none")
    head = d["lm_head"]
    if head["lens_reproduces_logits"]:
        extra = []
        if head["between"]:
            extra.append("then " + ", ".join(head["between"]))
        if head["logit_scale"] != 1.0:
            extra.append(f"logits x {head['logit_scale']:.4g}")
        if head["softcap"]:
            extra.append(f"soft cap {head['softcap']:g}")
        lines.append(f"lm head      {head['module']}{' (tied)' if head['tied'] else ''}"
                     f"{'; ' + '; '.join(extra) if extra else ''}; logit lens of the last layer = logits "
                     f"(max |diff| {head['max_abs_diff']:.2g})")
    else:
        lines.append(f"lm head      no logit lens: {head['why_not']}")
    lines.append("")
    lines.append(f"{'site':<14}{'layers':<10}{'tap':<8}module")
    for name, s in d["sites"].items():
        lines.append(f"{name:<14}{s['layers']:<10}{s['tap']:<8}{s['module']}")
    if d["absent"]:
        lines.append("")
        lines.append("absent sites")
        for name, why in d["absent"].items():
            lines.append(f"  {name:<14}{why}")
    for note in d["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)
