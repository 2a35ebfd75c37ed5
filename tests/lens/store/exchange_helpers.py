"""Shared by the export / import tests (tests/lens/store/test_export_*.py, test_import_*.py): small stores of the
session's tiny-llama, the command line run in process, and the one-line refusal."""

from __future__ import annotations

from pathlib import Path

import lens

# four 32-token windows per 64-token... shard: 400 tokens of lee in several shards, a per-layer site and a
# single-position one
KW = dict(corpus="lee", max_tokens=400, seq_len=32, batch_size=2, shard_tokens=128, sites=["resid_post", "embed"],
          layers="0,1,2", progress=False)


def make_store(model, root: Path, dtype: str = "float32", **kw) -> Path:
    lens.capture(model, out=root, dtype=dtype, **{**KW, **kw})
    return root


def cli(argv, capsys) -> tuple[int, str, str]:
    from app.commands.cli import main

    capsys.readouterr()
    rc = main([str(a) for a in argv])
    got = capsys.readouterr()
    return rc, got.out, got.err


def one_error_line(err: str) -> str:
    lines = [l for l in err.splitlines() if l.strip() and "%|" not in l and not l.startswith("WARNING")]
    assert len(lines) == 1 and lines[0].startswith("lens: error:") and "Traceback" not in err, err
    return lines[0]


def nothing_at(out: Path) -> bool:
    """Nothing that reads as an export or a store at ``out``, and no staging folder beside it."""
    return not out.exists() and not list(out.parent.glob(f".{out.name}.partial-*"))
