"""``lens store info``, ``verify`` and ``merge``: what a store holds, whether every byte of it is as written, and
one store from the parts of a split capture."""

from __future__ import annotations

import dataclasses
import json
import time

from app.commands import exchange
from app.commands.flags import Parser, describe_commands
import lens
from lens.errors import StoreCorruptError
from lens.store.fidelity import describe as describe_fidelity


def add_parsers(sub) -> None:
    store = sub.add_parser("store", help="inspect, verify, merge, export or import stores")
    store_sub = store.add_subparsers(dest="store_command", required=True, parser_class=Parser)
    info = store_sub.add_parser("info", help="describe a store and summarise each layer")
    info.add_argument("path", help="a store folder (lens capture --out)")
    info.add_argument("--json", action="store_true", help="print the description as JSON")
    info.add_argument("--no-stats", action="store_true", help="skip the per-layer statistics")
    info.add_argument("--verify", action="store_true", help="also read every byte and check every checksum")
    ver = store_sub.add_parser("verify", help="read every byte of a store, check every checksum and the schema")
    ver.add_argument("path", help="a store folder (lens capture --out)")
    ver.add_argument("--json", action="store_true", help="print the report as JSON")
    mrg = store_sub.add_parser("merge", help="join the parts of a capture split with --part I/N into one store")
    mrg.add_argument("parts", nargs="+", help="the part store folders (any order)")
    mrg.add_argument("--out", required=True, help="the new store folder")
    mrg.add_argument("--quiet", action="store_true", help="no progress bar")
    exchange.add_store_parsers(store_sub)
    describe_commands(store_sub)


def _cmd_store(args):
    return {"verify": _cmd_store_verify, "merge": _cmd_store_merge,
            **exchange.COMMANDS}.get(args.store_command, _cmd_store_info)(args)


def _cmd_store_info(args):
    from lens.store.format import sample_label

    store = lens.open_store(args.path)
    m = store.manifest
    rows = [] if args.no_stats else store.summary()
    report = _verify(args.path) if args.verify else None
    counts = _nonfinite_counts(store, rows, report)
    lies = _nonfinite_lies(store, counts) if rows and report is None else []  # --verify reports them itself
    fidelity_lines = describe_fidelity(m)  # the capture's check against Hugging Face (lens.store.fidelity)
    if args.json:
        print(json.dumps({"manifest": {k: v for k, v in m.to_dict().items() if k != "shards"},
                          "n_shards": len(m.shards), "layers": rows,
                          "nonfinite": {s: {str(l): c for l, c in v.items()} for s, v in counts.items()},
                          "nonfinite_mismatch": lies, "fidelity": m.fidelity,  # null: not recorded
                          "fidelity_lines": fidelity_lines,
                          **({"verify": _report_dict(report)} if report else {})}, indent=1))
        return _verdict(report) or _refuse_lies(args.path, lies)
    print(f"store      {args.path}")
    print(f"model      {m.model_id} ({m.model.get('revision', '')})")
    print(f"corpus     {m.corpus['name']}  transform={m.corpus.get('transform')}")
    print(f"tokens     {m.n_tokens} of {m.n_tokens_planned} planned, {len(m.shards)} shards, "
          f"{'complete' if m.complete else 'INCOMPLETE (resume with --resume)'}")
    print(f"sample     {sample_label(m)}, max_tokens {(m.settings or {}).get('max_tokens')}")
    if isinstance(m.imported, dict):  # a store made by lens store import: where its states came from
        print(f"imported   from {m.imported.get('from')}: {m.imported.get('path')}")
    print(f"dtype      {m.dtype} (stored)   model {(m.settings or {}).get('model_dtype', m.model.get('dtype'))}   "
          f"d_model {m.d_model}   format {m.format_version}")
    for site, layers in m.sites.items():
        print(f"site       {site}: layers {list(layers) if layers != (None,) else '-'}")
    for i, line in enumerate(fidelity_lines):
        print(f"{'fidelity' if i == 0 else '':<11}{line}")
    for line in _nonfinite_lines(counts):
        print(f"NON-FINITE {line}")
    for line in lies:
        print(f"PROBLEM    {line}")
    if rows:
        print(f"{'site':<12}{'layer':>6}{'mean |h|':>12}{'mean':>10}{'max |x|':>11}{'non-finite':>12}")
        for r in rows:
            layer = "-" if r["layer"] is None else r["layer"]
            flag = f"{r['nonfinite']:>12}" if r["nonfinite"] else f"{'0':>12}"
            print(f"{r['site']:<12}{layer:>6}{r['mean_norm']:>12.3f}{r['mean']:>10.4f}{r['max_abs']:>11.2f}{flag}")
    if report:
        _print_report(report)
    return _verdict(report) or _refuse_lies(args.path, lies)


def _nonfinite_counts(store, rows, report) -> dict:
    """site -> {layer: NaN/inf count}, non-zero only: counted in the data by the statistics or by
    --verify when either ran, else as the manifest records them."""
    counts: dict = {}
    if rows:
        for r in rows:
            if r["nonfinite"]:
                counts.setdefault(r["site"], {})[r["layer"]] = r["nonfinite"]
    elif report is not None:
        counts = {s: dict(v) for s, v in report.nonfinite.items()}
    else:
        for site in store.sites:
            for layer, c in (store.nonfinite(site) or {}).items():
                if c:
                    counts.setdefault(site, {})[layer] = c
    return counts


def _nonfinite_lies(store, counted: dict) -> list[str]:
    """Where the data holds other NaN/inf counts than the manifest records (a store re-sealed after its
    capture): one line per site and layer."""
    out = []
    for site in store.sites:
        recorded = store.nonfinite(site)
        if recorded is None:  # format 1: nothing recorded
            continue
        for layer, want in recorded.items():
            got = counted.get(site, {}).get(layer, 0)
            if got != want:
                at = site if layer is None else f"{site} layer {layer}"
                out.append(f"{at}: the data holds {got} non-finite values (NaN or inf), the manifest records {want} — the store was "
                           "altered after its capture; studies refuse it")
    return out


def _refuse_lies(path, lies: list) -> None:
    if lies:
        more = f" (and {len(lies) - 1} more, listed above)" if len(lies) > 1 else ""
        raise StoreCorruptError(f"store {path}: {lies[0]}{more}")


def _nonfinite_lines(counts: dict) -> list[str]:
    """One line per site with non-finite values."""
    out = []
    for site, by_layer in counts.items():
        where = "" if list(by_layer) == [None] else f" layers {', '.join(map(str, by_layer))}"
        out.append(f"{site}{where}: {sum(by_layer.values())} NaN/inf values — studies refuse these layers")
    return out


def _verify(path):
    from lens.store.verify import verify_store

    return verify_store(path)


def _report_dict(report) -> dict:
    d = dataclasses.asdict(report)
    d["nonfinite"] = {s: {str(l): c for l, c in v.items()} for s, v in report.nonfinite.items()}
    return {**d, "ok": report.ok}


def _print_report(report) -> None:
    print(f"verify     {report.path}: format {report.format_version}, {report.n_shards} shards, "
          f"{report.n_tokens} tokens, {report.n_files} files, {report.n_bytes / 1e6:.1f} MB read"
          f"{'' if report.complete else ' (incomplete store)'}")
    for w in report.warnings:
        print(f"WARNING    {w}")
    for site, by_layer in report.nonfinite.items():
        print(f"NON-FINITE {site}: " + ", ".join(f"{'-' if l is None else f'layer {l}'}: {c}" for l, c in by_layer.items()))
    for p in report.problems:
        print(f"PROBLEM    {p}")
    print("verify     OK: every checksum and the schema hold" if report.ok
          else f"verify     FAILED: {len(report.problems)} problems")


def _verdict(report) -> int | None:
    if report is None or report.ok:
        return None

    more = f" (and {len(report.problems) - 1} more, listed above)" if len(report.problems) > 1 else ""
    raise StoreCorruptError(f"store {report.path} failed verification: {report.problems[0]}{more}")


def _cmd_store_verify(args):
    report = _verify(args.path)
    if args.json:
        print(json.dumps(_report_dict(report), indent=1))
    else:
        _print_report(report)
    return _verdict(report)


def _cmd_store_merge(args):
    from lens.store.parts import merge_stores

    t0 = time.time()
    out = merge_stores(args.parts, args.out, progress=not args.quiet)
    store = lens.open_store(out)
    print(f"merged {len(args.parts)} parts into {out}: {store.n_tokens} tokens of {store.model_id}, "
          f"{len(store.manifest.shards)} shards ({time.time() - t0:.1f} s)")


COMMANDS = {"store": _cmd_store}
