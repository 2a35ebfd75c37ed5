"""The family matrix: tiny random models of many transformers families, each captured at every site it
has by every backend, and checked against Hugging Face and the block identities.

:func:`family_report` does the work once per family (cached) and returns what held; the tests in
``test_families.py`` assert on it, and ``docs/coverage.md`` is rendered from the same reports
(:func:`render_coverage`), so the coverage table is produced by the checks that prove it.
"""

from __future__ import annotations

import functools
import os
import traceback

import torch

import lens
from lens.capturing.backends.tl import TRANSFORMER_LENS_HOOKS
from lens.model.card import BlockKind
from lens.text.corpora import load_corpus, make_windows
from lens.errors import LensInputError
from lens.sites import Site

ATOL = 1e-5
LENS_ATOL = 1e-4
BACKENDS = ("native", "transformer-lens", "nnsight")

# model_type -> the block kind its site map must derive (a regression in the derivation fails here).
FAMILIES: dict[str, BlockKind] = {
    # pre-norm, sequential
    **{t: BlockKind.SEQUENTIAL for t in (
        "llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "olmo", "stablelm", "starcoder2", "gpt2",
        "gpt_bigcode", "gpt_neo", "opt", "biogpt", "xglm", "bloom", "mpt", "granite", "nemotron", "persimmon",
        "helium", "glm", "smollm3", "ctrl", "gpt_neox_japanese", "ernie4_5", "seed_oss", "vaultgemma", "lfm2",
        "bitnet", "diffllama", "apertus", "modernbert-decoder", "hunyuan_v1_dense", "arcee", "jetmoe", "dbrx",
        "minicpm3")},  # jetmoe, dbrx: experts without a router child that returns logits; minicpm3: scaled sub-blocks
    # sandwich norms
    **{t: BlockKind.SANDWICH for t in ("gemma2", "gemma3_text", "olmo2", "olmo3", "glm4", "exaone4")},
    # parallel attention + MLP
    **{t: BlockKind.PARALLEL for t in ("gpt_neox", "gptj", "codegen", "falcon", "phi", "cohere", "cohere2")},
    # mixtures of experts (router logits as a site)
    **{t: BlockKind.SEQUENTIAL for t in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "phimoe", "granitemoe",
                                         "gpt_oss", "ernie4_5_moe", "llama4_text", "minimax_m2",
                                         "deepseek_v3")},  # deepseek_v3: latent attention too
    "cohere2_moe": BlockKind.PARALLEL,
    # state-space, recurrent and hybrid
    **{t: BlockKind.RECURRENT for t in ("mamba", "mamba2", "falcon_mamba", "rwkv", "jamba", "bamba",
                                        "granitemoehybrid", "nemotron_h", "qwen3_next", "recurrent_gemma", "falcon_h1",
                                        "minimax", "qwen3_5_text")},
    # encoders
    **{t: BlockKind.POST_NORM for t in ("bert", "roberta", "electra", "camembert", "xlm-roberta", "distilbert",
                                        "deberta-v2", "mpnet", "nomic_bert")},
    **{t: BlockKind.SEQUENTIAL for t in ("megatron-bert", "modernbert", "roberta-prelayernorm")},
}
MOE = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "phimoe", "granitemoe", "gpt_oss", "ernie4_5_moe",
       "llama4_text", "minimax_m2", "cohere2_moe", "deepseek_v3"}

# One family of each kind runs the studies end to end (tests/studies/per_study/test_family_studies.py).
ONE_OF_EACH = {"sandwich": "gemma2", "parallel": "gpt_neox", "moe": "mixtral", "state-space": "mamba",
               "encoder": "roberta"}


def _windows(model, n_windows=4, seq_len=16):
    win = make_windows(load_corpus("lee"), model.tokenizer, seq_len=seq_len, max_tokens=n_windows * seq_len,
                       is_causal=model.is_causal)
    return win


def _padded(win, lo, hi, pad_id):
    chunk = win.input_ids[lo:hi]
    width = max(len(c) for c in chunk)
    ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, c in enumerate(chunk):
        ids[i, :len(c)] = torch.as_tensor(c)
        mask[i, :len(c)] = 1
    return ids, mask


def _close(a, b, atol=ATOL) -> float | None:
    """max |a - b| when shapes agree, else None."""
    if a is None or b is None or tuple(a.shape) != tuple(b.shape):
        return None
    return float((a.float() - b.float()).abs().max())


def _hf_reference(model, win, batch=2):
    """Hugging Face's hidden states (and logits) on the capture's own padded batches, real rows only,
    plus the last block's output and the final norm's output read by plain hooks of this test."""
    pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
    hf = model.hf_model
    last_block = hf.get_submodule(model.site_map.layers)[model.n_layers - 1]
    norm = model.final_norm
    rows = {"hidden": [], "last": [], "norm": [], "logits": []}
    seen = {}
    handles = [last_block.register_forward_hook(lambda m, a, o: seen.__setitem__("last", o[0] if isinstance(o, tuple) else o))]
    if norm is not None:
        handles.append(norm.register_forward_hook(lambda m, a, o: seen.__setitem__("norm", o)))
    try:
        with torch.inference_mode():
            for lo in range(0, win.n_windows, batch):
                ids, mask = _padded(win, lo, min(lo + batch, win.n_windows), pad)
                out = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
                keep = mask.bool()
                hs = out.hidden_states
                rows["hidden"].append(None if hs is None else [h[keep] for h in hs])
                rows["last"].append(seen["last"][keep])
                rows["norm"].append(seen["norm"][keep] if "norm" in seen else None)
                logits = getattr(out, "logits", None)
                rows["logits"].append(None if logits is None else logits[keep])
    finally:
        for h in handles:
            h.remove()
    cat = lambda xs: None if any(x is None for x in xs) else torch.cat(xs)  # noqa: E731
    hidden = None
    if all(h is not None for h in rows["hidden"]):
        hidden = [torch.cat([h[i] for h in rows["hidden"]]) for i in range(len(rows["hidden"][0]))]
    return {"hidden": hidden, "last": cat(rows["last"]), "norm": cat(rows["norm"]), "logits": cat(rows["logits"])}


def _embedding(model, win):
    """The token-embedding table looked up for the capture's tokens, times the family's embedding scale."""
    emb = model.hf_model.get_input_embeddings()
    ids = torch.as_tensor(win.rows["token_id"])
    with torch.inference_mode():
        x = emb(ids)
    scale = model.card().embed_scale
    return x * scale if scale else x


def _identities(card, get) -> dict:
    """The block identities the sites of ``card`` must satisfy, as max |diff| per check."""
    out = {}
    L = card.n_layers
    for l in range(L):
        pre, post = get("resid_pre", l), get("resid_post", l)
        if card.block in (BlockKind.SEQUENTIAL, BlockKind.SANDWICH):
            mid, a, m = get("resid_mid", l), get("attn_out", l), get("mlp_out", l)
            out[f"resid_mid = resid_pre + attn_out @{l}"] = _close(mid, pre + a)
            out[f"resid_post = resid_mid + mlp_out @{l}"] = _close(post, mid + m)
        elif card.block is BlockKind.PARALLEL:
            a, m = get("attn_out", l), get("mlp_out", l)
            out[f"resid_post = resid_pre + attn_out + mlp_out @{l}"] = _close(post, pre + a + m)
        if l + 1 < L:
            out[f"resid_pre[{l + 1}] = resid_post[{l}]"] = _close(get("resid_pre", l + 1), post)
    return out


@functools.lru_cache(maxsize=None)
def family_report(model_type: str) -> dict:
    """Everything the family tests and the coverage table need, for one tiny model."""
    report = {"model_type": model_type, "error": None, "backends": {}}
    try:
        model = lens.load_model(f"tiny:{model_type}")
    except Exception as exc:  # noqa: BLE001 — recorded, asserted on by the tests
        report["error"] = f"{type(exc).__name__}: {exc}"
        return report
    card = model.card()
    report.update(card=card, block=card.block, sites=list(card.sites), absent=dict(card.absent),
                  lens=card.has_lm_head, head_note=card.head_note)
    win = _windows(model)
    per_layer = [s for s in card.sites if Site(s).per_layer]
    stores = {}
    for backend in BACKENDS:
        sites = [s for s in card.sites if backend != "transformer-lens" or Site(s) in TRANSFORMER_LENS_HOOKS]
        try:
            stores[backend] = lens.capture(model, corpus="lee", sites=sites, max_tokens=win.n_tokens,
                                           seq_len=16, batch_size=2, backend=backend, progress=False)
            report["backends"][backend] = "ok"
        except LensInputError as exc:
            report["backends"][backend] = f"refused: {exc}"
        except Exception as exc:  # noqa: BLE001
            report["backends"][backend] = f"error: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
    native = stores.get("native")
    if native is None:
        return report
    report["n_tokens"] = native.n_tokens

    def get(site, layer=None):
        if site not in card.sites:
            return None
        if Site(site).per_layer and layer not in native.layers(site):
            return None
        return native.get(site, layer)

    ref = _hf_reference(model, win)
    checks = {}
    L = card.n_layers
    checks["native rows = capture rows"] = 0.0 if ref["last"].shape[0] == native.n_tokens else None
    hs = ref["hidden"]
    if hs is not None and len(hs) == L + 1 and _close(get("embed"), hs[0]) is not None and \
            _close(get("embed"), hs[0]) <= ATOL:  # hidden_states[0] is the embedding (most families)
        checks["embed = hidden_states[0]"] = _close(get("embed"), hs[0])
        for l in range(L - 1):
            checks[f"resid_post[{l}] = hidden_states[{l + 1}]"] = _close(get("resid_post", l), hs[l + 1])
    elif hs is not None and len(hs) >= L:  # Mamba's convention: hidden_states[l] is block l's output
        report["hidden_states_note"] = "hidden_states[l] is block l's output in this family (no embedding entry)"
        checks["embed = embedding lookup x scale"] = _close(get("embed"), _embedding(model, win))
        for l in range(L - 1):
            checks[f"resid_post[{l}] = hidden_states[{l}]"] = _close(get("resid_post", l), hs[l])
    else:
        report["hidden_states_note"] = (f"Hugging Face returned {None if ref['hidden'] is None else len(ref['hidden'])}"
                                        f" hidden states for {L} layers: compared with hooks only")
    checks[f"resid_post[{L - 1}] = last block (hook)"] = _close(get("resid_post", L - 1), ref["last"])
    if "final_norm" in card.sites:
        checks["final_norm = final norm (hook)"] = _close(get("final_norm"), ref["norm"])
    checks.update(_identities(card, get))
    if card.has_lm_head and ref["logits"] is not None:
        decoded = model.decode(get("resid_post", L - 1))
        report["lens_max_diff"] = _close(decoded, ref["logits"])
    if "router_logits" in card.sites:
        r = get("router_logits", native.layers("router_logits")[0])
        checks["router_logits width = n_experts"] = 0.0 if r.shape == (native.n_tokens, card.n_experts) else None
    report["checks"] = checks
    site_ok = {}
    for backend, store in stores.items():
        for site in card.sites:
            if not store.has(site):
                site_ok[(backend, site)] = False
                continue
            layers = store.layers(site) if Site(site).per_layer else [None]
            diffs = [_close(store.get(site, l), native.get(site, l)) for l in layers]
            site_ok[(backend, site)] = all(d is not None and d <= ATOL for d in diffs)
    report["site_ok"] = site_ok
    report["per_layer"] = per_layer
    return report


def native_failures(report: dict) -> list[str]:
    """Checks of the native capture that did not hold (empty when the family is covered)."""
    bad = [f"{k}: {v}" for k, v in report.get("checks", {}).items() if v is None or v > ATOL]
    if report.get("lens") and (report.get("lens_max_diff") is None or report["lens_max_diff"] > LENS_ATOL):
        bad.append(f"logit lens of the last layer vs logits: {report.get('lens_max_diff')}")
    return bad


# --------------------------------------------------------------------------------------- coverage table
SITE_ORDER = [s.value for s in Site]
MARK = {"ok": "✓", "absent": "–", "refused": "✗"}


PREAMBLE = [
    "# Coverage: families × sites × backends",
    "",
    "Generated by `tests/lens/model/test_families.py` (`LENS_WRITE_COVERAGE=1 make test-families` rewrites it;",
    "the test fails when this file differs from what the checks produce). Each family is a tiny random",
    "model built offline from its transformers config (`lens.load_model(\"tiny:<model_type>\")`). A ✓ means the",
    "site was captured and checked: against Hugging Face `output_hidden_states` (embed, resid_post), against",
    "a plain forward hook (the last block, the final norm), and by the block identities (`resid_mid =",
    "resid_pre + attn_out`, `resid_post = resid_mid + mlp_out`, or `resid_pre + attn_out + mlp_out` in",
    "parallel blocks), all at atol 1e-5 in fp32; for TransformerLens and nnsight, equal to the native",
    "capture at 1e-5. ✗: the backend refuses the site or the family (it reads another tensor there, or",
    "cannot run the model). –: the site does not exist in the family (the reason is in `lens inspect`).",
    "lens: the logit lens of the last layer reproduces the model's logits (max |diff| ≤ 1e-4).",
    "",
    "| family | block | " + " | ".join(SITE_ORDER) + " | lens | TransformerLens | nnsight |",
    "|" + "---|" * (len(SITE_ORDER) + 5),
]
ALL_SITES_OK = "all sites ✓"


def coverage_row(report: dict) -> str:
    """One family's line of the coverage table, from its report."""
    r = report
    if r["error"]:
        return f"| {r['model_type']} | refused: {r['error'].splitlines()[0][:80]} |" + " |" * (len(SITE_ORDER) + 3)
    cells = []
    for site in SITE_ORDER:
        if site not in r["sites"]:
            cells.append(MARK["absent"])
        else:
            cells.append(MARK["ok"] if r["site_ok"].get(("native", site)) and not native_failures(r) else "✗")
    backend_cells = []
    for b in ("transformer-lens", "nnsight"):
        status = r["backends"].get(b, "")
        named = [s for s in r["sites"] if b != "transformer-lens" or Site(s) in TRANSFORMER_LENS_HOOKS]
        unnamed = [s for s in r["sites"] if s not in named]
        if status == "ok" and all(r["site_ok"].get((b, s)) for s in named):
            backend_cells.append(ALL_SITES_OK if not unnamed else f"{ALL_SITES_OK} but {', '.join(unnamed)} (no hook)")
        elif status.startswith("refused"):
            backend_cells.append("✗ " + _short_reason(status))
        else:
            ok = [s for s in r["sites"] if r["site_ok"].get((b, s))]
            backend_cells.append(f"{len(ok)}/{len(r['sites'])} sites" if ok else "✗ error")
    lens_cell = "✓" if r["lens"] else "–"
    return (f"| {r['model_type']} | {r['block'].value} | " + " | ".join(cells)
            + f" | {lens_cell} | " + " | ".join(backend_cells) + " |")


def row_family(row: str) -> str:
    return row.split("|")[1].strip()


def coverage_summary(rows: list[str]) -> str:
    """The closing count line, read off the rows themselves: a family is covered natively when it is not
    refused and none of its sites is ✗; by another backend when its cell starts with "all sites ✓"."""
    native = tl = nn = 0
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if cells[1].startswith("refused"):
            continue
        native += "✗" not in cells[2:2 + len(SITE_ORDER)]
        tl += cells[-2].startswith(ALL_SITES_OK)
        nn += cells[-1].startswith(ALL_SITES_OK)
    return f"Families covered: native {native} of {len(rows)}, TransformerLens {tl}, nnsight {nn}."


def render_coverage(model_types) -> str:
    rows = [coverage_row(family_report(t)) for t in model_types]
    return "\n".join(PREAMBLE + rows + ["", coverage_summary(rows), ""])


def split_coverage(text: str) -> tuple[list[str], list[str], list[str]]:
    """(preamble lines, table rows, the rest) of a coverage file."""
    lines = text.split("\n")
    n = len(PREAMBLE)
    head, body = lines[:n], lines[n:]
    rows = []
    while body and body[0].startswith("| "):
        rows.append(body.pop(0))
    return head, rows, body


def _short_reason(status: str) -> str:
    text = status.removeprefix("refused: ")
    if "reads another tensor" in text:
        return "reads another tensor at " + text.split(" at ", 1)[1].split(" (")[0]
    if "Unsupported architecture" in text or "cannot wrap" in text:
        return "unsupported architecture"
    if "backend cannot run" in text:  # "...: ExceptionType: message; use --backend native"
        parts = text.split(": ")
        kind = next((p for p in parts if p.endswith(("Error", "Exception"))), "error")
        return f"bridge fails on this family ({kind})"
    return text.split(";")[0][:60]


def coverage_path():
    from pathlib import Path

    return Path(__file__).resolve().parents[2] / "docs" / "coverage.md"


def write_coverage_requested() -> bool:
    return os.environ.get("LENS_WRITE_COVERAGE") == "1"
