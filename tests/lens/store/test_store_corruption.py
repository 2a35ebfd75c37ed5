"""Every kind of damage to every kind of store file is detected: exit 2 with one line naming the file,
never wrong data and never an internal error (issue 14).

Each case copies a sound store, damages one file (bytes flipped, truncated, deleted, swapped, a
valid-JSON edit of the manifest), and then runs ``lens store verify``, ``lens store info`` (which
reads every layer) and the Python API reading every layer. The ``sealed-*`` cases go further and
recompute the manifest's checksum after the edit — a hostile or buggy writer — so only the schema
and the per-file checks stand between them and wrong data.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import lens
from lens.errors import LensInputError
from lens.store.format import manifest_digest

SHARD = "shards/00001"


@pytest.fixture(scope="module")
def sound(tiny_llama, tiny_gpt2, tmp_path_factory):
    """A sound store (3 shards; resid_post and mlp_out have the same shape, embed is single-position)
    and one of another model with the same token table, for swapped manifests."""
    base = tmp_path_factory.mktemp("sound")
    # the first 384 tokens (full windows only: shards of equal size), not a spread sample of whole windows
    kw = dict(corpus="lee", sites=["resid_post", "mlp_out", "embed"], max_tokens=384, seq_len=64, batch_size=2,
              shard_tokens=128, sample="first", progress=False)
    lens.capture(tiny_llama, out=base / "store", **kw)
    lens.capture(tiny_gpt2, out=base / "other", **kw)
    m = json.loads((base / "store" / "manifest.json").read_text())
    assert len(m["shards"]) == 3 and len({s["n_tokens"] for s in m["shards"]}) == 1
    return base


# ---------------------------------------------------------------------------------------- damage
def flip(rel: str, offset):
    def do(root: Path):
        p = root / rel
        data = bytearray(p.read_bytes())
        i = offset(data) if callable(offset) else offset
        data[i] ^= 0xFF
        p.write_bytes(bytes(data))
    return do


def truncate(rel: str, n: int = 10):
    return lambda root: (root / rel).write_bytes((root / rel).read_bytes()[:-n])


def extend(rel: str):
    return lambda root: (root / rel).write_bytes((root / rel).read_bytes() + b"\0" * 16)


def delete(rel: str):
    return lambda root: (root / rel).unlink()


def swap(a: str, b: str):
    def do(root: Path):
        tmp = root / "swap.tmp"
        (root / a).rename(tmp)
        (root / b).rename(root / a)
        tmp.rename(root / b)
    return do


def replace_bytes(rel: str, old: bytes, new: bytes):
    def do(root: Path):
        data = (root / rel).read_bytes()
        assert old in data[:128] and len(old) == len(new)
        (root / rel).write_bytes(data.replace(old, new, 1))
    return do


def header_end(data) -> int:
    return data.index(b"\n") + 1


def swap_layer_blocks(rel: str):
    def do(root: Path):
        data = bytearray((root / rel).read_bytes())
        h = header_end(data)
        block = (len(data) - h) // 4
        a, b = data[h:h + block], data[h + block:h + 2 * block]
        data[h:h + block], data[h + block:h + 2 * block] = b, a
        (root / rel).write_bytes(bytes(data))
    return do


def zero_data(rel: str):
    def do(root: Path):
        data = bytearray((root / rel).read_bytes())
        h = header_end(data)
        data[h:] = bytes(len(data) - h)
        (root / rel).write_bytes(bytes(data))
    return do


def copy_from(src: str, dst: str):
    return lambda root: shutil.copyfile(root / src, root / dst)


def symlink_to(src: str, dst: str):
    def do(root: Path):
        (root / dst).unlink()
        (root / dst).symlink_to(root / src)
    return do


def dir_instead(rel: str):
    def do(root: Path):
        (root / rel).unlink()
        (root / rel).mkdir()
    return do


def write_manifest_text(text):
    return lambda root: (root / "manifest.json").write_bytes(text if isinstance(text, bytes) else text.encode())


def edit_manifest(fn, reseal: bool = False):
    def do(root: Path):
        m = json.loads((root / "manifest.json").read_text())
        fn(m)
        if reseal:
            m["manifest_sha256"] = manifest_digest(m)
        (root / "manifest.json").write_text(json.dumps(m, indent=1))
    return do


def other_manifest(root: Path):
    shutil.copyfile(root.parent / "other-manifest.json", root / "manifest.json")


def pickled_tokens(root: Path):
    """An object array whose unpickling would create a file: it must be refused unread."""
    class Evil:
        def __reduce__(self):
            return (open, (str(root / "PWNED"), "w"))

    path = root / SHARD / "tokens.token.npy"
    np.save(path, np.array([Evil()] * 128, dtype=object), allow_pickle=True)
    m = json.loads((root / "manifest.json").read_text())
    from lens.store.format import crc32_file

    m["shards"][1]["files"]["tokens.token.npy"] = {"bytes": path.stat().st_size, "crc32": crc32_file(path)}
    m["manifest_sha256"] = manifest_digest(m)
    (root / "manifest.json").write_text(json.dumps(m))


def _set(path: list, value):
    def fn(m):
        d = m
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return fn


def _del(path: list):
    def fn(m):
        d = m
        for k in path[:-1]:
            d = d[k]
        del d[path[-1]]
    return fn


def _bf16(m):
    m["dtype"], m["storage_dtype"] = "bfloat16", "bfloat16-as-uint16"


def _drop_shard(i):
    return lambda m: (m["shards"].pop(i), m.update(n_tokens=sum(s["n_tokens"] for s in m["shards"])))


RP = f"{SHARD}/resid_post.npy"
CASES = {
    # data blocks
    "data-flip-first": (flip(RP, header_end), "resid_post.npy"),
    "data-flip-middle": (flip(RP, lambda d: len(d) // 2), "resid_post.npy"),
    "data-flip-last": (flip(RP, -1), "resid_post.npy"),
    "data-zeroed": (zero_data(RP), "resid_post.npy"),
    "data-truncated": (truncate(RP), "resid_post.npy"),
    "data-extended": (extend(RP), "resid_post.npy"),
    "data-deleted": (delete(RP), "resid_post.npy"),
    "data-dir-instead": (dir_instead(RP), "resid_post.npy"),
    "data-symlink": (symlink_to("shards/00000/resid_post.npy", RP), "resid_post.npy"),
    "data-swap-sites": (swap(RP, f"{SHARD}/mlp_out.npy"), ".npy"),
    "data-swap-layer-blocks": (swap_layer_blocks(RP), "resid_post.npy"),
    "data-from-other-shard": (copy_from("shards/00000/resid_post.npy", RP), "resid_post.npy"),
    "data-swap-shard-folders": (swap("shards/00000", SHARD), "shards/0000"),
    "data-embed-flip": (flip(f"{SHARD}/embed.npy", -3), "embed.npy"),
    # npy headers
    "header-f4-to-i4": (replace_bytes(RP, b"'<f4'", b"'<i4'"), "resid_post.npy"),
    "header-f4-to-big-endian": (replace_bytes(RP, b"'<f4'", b"'>f4'"), "resid_post.npy"),
    "header-shape": (replace_bytes(RP, b"(4, 128, 64)", b"(4, 64, 128)"), "resid_post.npy"),
    "header-fortran": (replace_bytes(RP, b"False", b"True "), "resid_post.npy"),
    "header-magic": (flip(RP, 1), "resid_post.npy"),
    "header-version": (flip(RP, 6), "resid_post.npy"),
    "header-length-field": (flip(RP, 8), "resid_post.npy"),
    "header-padding": (flip(RP, lambda d: header_end(d) - 3), "resid_post.npy"),
    "header-embed-dtype": (replace_bytes(f"{SHARD}/embed.npy", b"'<f4'", b"'<u4'"), "embed.npy"),
    # token columns
    "tokens-flip-token-id": (flip(f"{SHARD}/tokens.token_id.npy", -5), "tokens.token_id.npy"),
    "tokens-flip-text": (flip(f"{SHARD}/tokens.token.npy", -2), "tokens.token.npy"),
    "tokens-flip-header": (replace_bytes(f"{SHARD}/tokens.doc.npy", b"'<i8'", b"'<f8'"), "tokens.doc.npy"),
    "tokens-truncated": (truncate(f"{SHARD}/tokens.doc.npy"), "tokens.doc.npy"),
    "tokens-deleted": (delete(f"{SHARD}/tokens.special.npy"), "tokens.special.npy"),
    "tokens-swap-columns": (swap(f"{SHARD}/tokens.doc_pos.npy", f"{SHARD}/tokens.token_id.npy"), "tokens."),
    "tokens-from-other-shard": (copy_from("shards/00000/tokens.doc_pos.npy", f"{SHARD}/tokens.doc_pos.npy"),
                                "tokens.doc_pos.npy"),
    "tokens-pickled-and-resealed": (pickled_tokens, "tokens.token.npy"),
    # the manifest: bytes
    "manifest-flip-byte": (flip("manifest.json", lambda d: len(d) // 2), "manifest.json"),
    "manifest-truncated": (lambda r: (r / "manifest.json").write_bytes((r / "manifest.json").read_bytes()[:2000]),
                           "manifest.json"),
    "manifest-deleted": (delete("manifest.json"), "manifest.json"),
    "manifest-dir-instead": (dir_instead("manifest.json"), "manifest.json"),
    "manifest-not-utf8": (write_manifest_text(b'{"format": "\xff\xfe"}'), "manifest.json"),
    "manifest-empty": (write_manifest_text(""), "manifest.json"),
    "manifest-list": (write_manifest_text("[]"), "manifest.json"),
    "manifest-null": (write_manifest_text("null"), "manifest.json"),
    "manifest-number": (write_manifest_text("42"), "manifest.json"),
    "manifest-empty-object": (write_manifest_text("{}"), "not an activation store"),
    "manifest-deep-nesting": (write_manifest_text("[" * 100000 + "]" * 100000), "manifest.json"),
    "manifest-other-store": (other_manifest, "shards/0000"),
    # the manifest: valid-JSON edits (the seal catches them; the schema names what it can)
    "edit-lacks-shards": (edit_manifest(_del(["shards"])), "manifest.json"),
    "edit-lacks-sites": (edit_manifest(_del(["sites"])), "manifest.json"),
    "edit-layers-reversed": (edit_manifest(lambda m: m["sites"]["resid_post"].reverse()), "manifest.json"),
    "edit-shard-dropped": (edit_manifest(_drop_shard(1)), "manifest.json"),
    "edit-last-shard-dropped": (edit_manifest(_drop_shard(-1)), "manifest.json"),
    "edit-shards-reordered": (edit_manifest(lambda m: m["shards"].reverse()), "manifest.json"),
    "edit-dtype-bfloat16": (edit_manifest(_bf16), "manifest.json"),
    "edit-n-tokens": (edit_manifest(_set(["n_tokens"], 999)), "manifest.json"),
    "edit-d-model": (edit_manifest(_set(["d_model"], 32)), "manifest.json"),
    "edit-crc": (edit_manifest(_set(["shards", 1, "files", "resid_post.npy", "layer_crc32", 0], "00000000")),
                 "manifest.json"),
    "edit-model-id": (edit_manifest(_set(["model", "model_id"], "tiny-gpt2")), "manifest.json"),
    "edit-complete-flag": (edit_manifest(_set(["complete"], False)), "manifest.json"),
    "edit-seal-removed": (edit_manifest(_del(["manifest_sha256"])), "manifest.json"),
    "edit-format-version-newer": (edit_manifest(_set(["format_version"], 99)), "newer format version"),
    "edit-format-version-string": (edit_manifest(_set(["format_version"], "2")), "manifest.json"),
    # valid-JSON edits with the seal recomputed: schema and file checks must still refuse them
    "sealed-layers-reversed": (edit_manifest(lambda m: m["sites"]["resid_post"].reverse(), True), "increasing"),
    "sealed-shard-dropped": (edit_manifest(_drop_shard(1), True), "shards[1].name must be 00001"),
    "sealed-shard-dropped-renumbered": (edit_manifest(lambda m: (_drop_shard(1)(m), m["shards"][1].update(name="00001")),
                                                      True), "contiguous"),
    "sealed-dtype-bfloat16": (edit_manifest(_bf16, True), "manifest.json"),
    "sealed-n-tokens": (edit_manifest(_set(["n_tokens"], 999), True), "n_tokens"),
    "sealed-shard-name-traversal": (edit_manifest(_set(["shards", 1, "name"], "../../etc"), True), "name"),
    "sealed-unknown-site": (edit_manifest(lambda m: m["sites"].update({"../x": [0]}), True), "unknown site"),
    "sealed-extra-file": (edit_manifest(lambda m: m["shards"][0]["files"].update(
        {"../../escape.npy": {"bytes": 1, "crc32": "00000000"}}), True), "files"),
    "sealed-header-crc": (edit_manifest(_set(["shards", 1, "files", "resid_post.npy", "header_crc32"], "0badf00d"),
                                        True), "resid_post.npy"),
    "sealed-layer-crc": (edit_manifest(_set(["shards", 2, "files", "mlp_out.npy", "layer_crc32", 3], "0badf00d"),
                                       True), "mlp_out.npy"),
    "sealed-token-crc": (edit_manifest(_set(["shards", 0, "files", "tokens.pos.npy", "crc32"], "0badf00d"), True),
                         "tokens.pos.npy"),
    "sealed-nonfinite": (edit_manifest(lambda m: (m["shards"][1]["nonfinite"]["resid_post"].__setitem__(0, 5),
                                                  m["nonfinite"]["resid_post"].__setitem__(0, 5)), True),
                         "non-finite"),
}


def _cli(capsys, *argv) -> tuple[int, str]:
    from app.commands.cli import main

    capsys.readouterr()
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err


def _read_everything(root: Path) -> None:
    store = lens.open_store(root)
    for site in store.sites:
        for layer in store.manifest["sites"][site]:
            store.get(site, layer)


@pytest.mark.parametrize("case", list(CASES))
def test_damage_is_detected_with_exit_2_and_one_line(case, sound, tmp_path, capsys):
    damage, named = CASES[case]
    root = tmp_path / "store"
    shutil.copytree(sound / "store", root, symlinks=True)
    shutil.copyfile(sound / "other" / "manifest.json", tmp_path / "other-manifest.json")
    damage(root)
    # `store info` counts the non-finite values of the data it reads, and refuses a manifest that says otherwise
    commands = [("store", "verify", root), ("store", "info", root)]
    for argv in commands:
        rc, err = _cli(capsys, *argv)
        lines = err.strip().splitlines()
        assert rc == 2, (argv, rc, err)
        assert len(lines) == 1 and lines[0].startswith("lens: error:") and "Traceback" not in err, err
        assert named in lines[0], lines[0]
    with pytest.raises(LensInputError):  # a block's NaN/inf count is checked on its first read too
        _read_everything(root)
    assert not (root / "PWNED").exists()  # nothing was unpickled


def test_a_sound_store_passes(sound, capsys):
    for argv in (("store", "verify", sound / "store"), ("store", "info", sound / "store", "--verify")):
        rc, err = _cli(capsys, *argv)
        assert rc == 0, err
    _read_everything(sound / "store")


def test_verify_lists_every_damaged_file(sound, tmp_path, capsys):
    root = tmp_path / "store"
    shutil.copytree(sound / "store", root)
    flip(RP, -1)(root)
    flip("shards/00002/tokens.token_id.npy", -1)(root)
    (root / "shards" / "00007.partial").mkdir()
    rc, err = _cli(capsys, "store", "verify", root)
    from lens.store.verify import verify_store

    report = verify_store(root)
    assert rc == 2 and "and 1 more" in err
    assert len(report.problems) == 2 and any("00002/tokens.token_id.npy" in p for p in report.problems)
    assert any("00007.partial" in w for w in report.warnings)


def test_format_1_store_is_read_with_its_headers_checked(sound, tmp_path, capsys):
    """A format 1 store (written before the manifest seal and header checksums) stays readable; a
    header edit in it is still refused because headers are compared with the manifest."""
    root = tmp_path / "v1"
    shutil.copytree(sound / "store", root)
    m = json.loads((root / "manifest.json").read_text())
    m["format_version"] = 1
    del m["manifest_sha256"], m["nonfinite"]
    from lens.store.format import crc32_file

    for s in m["shards"]:
        del s["nonfinite"]
        for fname, meta in s["files"].items():
            if "header_bytes" in meta:
                meta.pop("header_bytes"), meta.pop("header_crc32")
                meta["crc32"] = crc32_file(root / "shards" / s["name"] / fname)
    (root / "manifest.json").write_text(json.dumps(m))
    ref = lens.open_store(sound / "store")
    old = lens.open_store(root)
    assert np.array_equal(old.get("resid_post", 2).numpy(), ref.get("resid_post", 2).numpy())
    rc, err = _cli(capsys, "store", "verify", root)
    assert rc == 0, err
    with pytest.raises(LensInputError, match="format 1 store.*capture into a new folder"):
        lens.capture(lens.load_model("tiny-llama"), corpus="lee", sites=["resid_post", "mlp_out", "embed"],
                     max_tokens=384, seq_len=64, batch_size=2, shard_tokens=128, progress=False, out=root,
                     resume=True)
    replace_bytes(RP, b"'<f4'", b"'<i4'")(root)
    rc, err = _cli(capsys, "store", "info", root)
    assert rc == 2 and "resid_post.npy: .npy header says dtype <i4" in err, err


def test_a_site_narrower_than_d_model_is_checked_at_its_width(tmp_path, capsys):
    """MoE router logits are stored (layers, tokens, n_experts): the schema and the header check use the
    manifest's ``widths``, and a resealed edit of that width is refused."""
    root = tmp_path / "moe"
    store = lens.capture(lens.load_model("tiny:mixtral"), corpus="lee", sites=["resid_post", "router_logits"],
                         max_tokens=200, seq_len=32, shard_tokens=128, progress=False, out=root)
    n_experts = store.manifest["widths"]["router_logits"]
    assert store.get("router_logits", 0).shape == (200, n_experts)
    rc, err = _cli(capsys, "store", "verify", root)
    assert rc == 0, err
    edit_manifest(_set(["widths", "router_logits"], n_experts + 1), True)(root)
    rc, err = _cli(capsys, "store", "info", root)
    assert rc == 2 and "width" in err and "router_logits.npy" in err, err
