"""``lens store export`` and ``lens store import``: a store in the field's formats (safetensors, a SAELens
activation cache, zarr v3), and hidden states captured elsewhere (vLLM's hidden-states files, a SAELens cache,
our own safetensors export) as a checked store (:mod:`lens.capturing.exchange`).

Cheap at import time (no torch): the parser is built from it."""

from __future__ import annotations

import time
from pathlib import Path

import lens
from lens.store.fidelity import record_of, verdict_line
from lens.store.fsio import human_bytes as human

EXPORT_FORMATS = ("safetensors", "saelens", "zarr")
IMPORT_FORMATS = ("vllm", "saelens", "safetensors")


def add_store_parsers(store_sub) -> None:
    """``export`` and ``import`` under ``lens store``."""
    exp = store_sub.add_parser("export", help="write a store as safetensors, a SAELens activation cache or zarr v3")
    exp.add_argument("path", help="a store folder (lens capture --out)")
    exp.add_argument("--to", required=True, metavar="FORMAT", help=f"one of {', '.join(EXPORT_FORMATS)}")
    exp.add_argument("--out", required=True, help="the new folder to write (never overwritten)")
    exp.add_argument("--sites", default=None, help="comma-separated sites to export (default: every stored site)")
    exp.add_argument("--layers", default=None, help="layers to export, e.g. 0,3,-1 or 2-6 (default: every stored layer)")
    exp.add_argument("--quiet", action="store_true", help="no progress bar")
    imp = store_sub.add_parser("import", help="make a checked store of hidden states captured elsewhere")
    imp.add_argument("src", help="a folder (or file) of the source: vLLM hidden-states files, a SAELens cache, "
                                 "or a lens safetensors export")
    imp.add_argument("--from", dest="source_format", required=True, metavar="FORMAT",
                     help=f"one of {', '.join(IMPORT_FORMATS)}")
    imp.add_argument("--model", default=None, help="the model the states come from (alias, Hugging Face id or folder): "
                                                   "its tokenizer gives the token texts, its forward verifies the states")
    imp.add_argument("--out", required=True, help="the new store folder")
    imp.add_argument("--layers", default=None,
                     help="vllm: the layer ids the files hold, in order (eagle_aux_hidden_state_layer_ids)")
    imp.add_argument("--no-verify", action="store_true",
                     help="do not compare the states with the model's forward (the store then says 'not verified')")
    imp.add_argument("--quiet", action="store_true", help="no progress bar")


def _size(path) -> int:
    p = Path(path)
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size


def cmd_export(args):
    from lens.capturing.exchange import export_store

    t0 = time.time()
    out = export_store(args.path, args.to, args.out, sites=args.sites, layers=args.layers, progress=not args.quiet)
    print(f"exported {args.path} to {args.to} in {out}: {human(_size(out))}, read back and checked "
          f"({time.time() - t0:.1f} s)")


def cmd_import(args):
    from lens.capturing.exchange import import_store

    t0 = time.time()
    out = import_store(args.src, args.source_format, args.out, model=args.model, layers=args.layers,
                       verify=not args.no_verify, progress=not args.quiet)
    store = lens.open_store(out)
    print(f"imported {args.src} ({args.source_format}) into {out}: {store.n_tokens} tokens of {store.model_id}, "
          f"{len(store.manifest.shards)} shards, every checksum read back ({time.time() - t0:.1f} s)")
    print(f"fidelity   {verdict_line(record_of(store.manifest))}")


COMMANDS = {"export": cmd_export, "import": cmd_import}
