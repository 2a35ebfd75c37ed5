"""Hostile or broken input files at load time: each ends as exit 2 with one line naming the file and what is
wrong — never a traceback, an internal error, a run that does not end, nor gigabytes for one long line.

The table runs every case through the real `lens` command line (`app.commands.cli.main`) in one fresh interpreter
(tests/lens/hostile_cli.py; torch is imported once), each with its own exit code and its own stderr as
the terminal gets it (file descriptor 2). A few run as `python -m app` processes of their own too.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

import pytest
import torch

import lens
from lens.text.corpora import document_ids, load_corpus, make_windows
from lens.errors import LensInputError
from lens.model.files import check_memory, check_safetensors

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "LENS_DEBUG": ""}


# --------------------------------------------------------------------------- a small real model folder
@pytest.fixture(scope="session")
def good_dir(tmp_path_factory):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lens.model.loading import smollm2_tokenizer

    tok = smollm2_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    path = tmp_path_factory.mktemp("models") / "good"
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _variant(good: Path, root: Path, name: str) -> Path:
    path = root / name
    shutil.copytree(good, path)
    return path


def _set_config(path: Path, **fields) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(fields)
    (path / "config.json").write_text(json.dumps(cfg))


def _safetensors(path: Path, header: bytes | dict, data: bytes = b"", size: int | None = None) -> None:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw) if size is None else size) + raw + data)


class _Payload:
    """A pickle that would create a file if it were ever unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def model_cases(good: Path, root: Path) -> list[tuple[str, Path, str]]:
    """(case, model folder, what the one line must say)."""
    cases = []

    def case(name, expect, edit):
        path = _variant(good, root, name)
        edit(path)
        cases.append((name, path, expect))

    case("layers-1e7", r"num_hidden_layers is 10000000: expected a positive integer",
         lambda p: _set_config(p, num_hidden_layers=10_000_000))
    case("hidden-2e40", r"hidden_size is 1099511627776", lambda p: _set_config(p, hidden_size=2**40))
    case("vocab-neg", r"vocab_size is -5", lambda p: _set_config(p, vocab_size=-5))
    case("heads-zero", r"num_attention_heads is 0", lambda p: _set_config(p, num_attention_heads=0))
    case("hidden-str", r"hidden_size is 64: expected a positive integer", lambda p: _set_config(p, hidden_size="64"))
    # plausible sizes whose weights no machine here holds: refused before anything is built
    case("too-large-bound", r"needs at least [0-9.]+ GiB for its float32 weights",
         lambda p: _set_config(p, num_hidden_layers=4000, hidden_size=65536, intermediate_size=65536))
    case("too-large-meta", r"needs [0-9.]+ GiB for its float32 weights",
         lambda p: _set_config(p, hidden_size=4096, intermediate_size=8_000_000, num_attention_heads=32,
                               num_key_value_heads=8))
    case("config-list", r"config\.json is not a JSON object", lambda p: (p / "config.json").write_text("[]"))
    case("config-garbage", r"config\.json is not valid JSON", lambda p: (p / "config.json").write_text("{oops"))
    case("config-deep", r"config\.json is nested too deeply",
         lambda p: (p / "config.json").write_text('{"a": ' + _nested(100_000) + "}"))
    case("config-fifo", r"config\.json is not a regular file",
         lambda p: ((p / "config.json").unlink(), os.mkfifo(p / "config.json")))

    def pickled(p):
        (p / "model.safetensors").unlink()
        (p / "pytorch_model.bin").write_bytes(pickle.dumps({"w": _Payload(root / "UNPICKLED")}))
    case("pickled-bin", r"pytorch_model\.bin holds pickled weights, which the workbench never loads", pickled)

    entry = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    case("st-header-huge", r"model\.safetensors is not a valid safetensors file: its header claims 1099511627776",
         lambda p: _safetensors(p, {"w": entry}, b"\0" * 16, size=2**40))
    case("st-past-end", r"lies at bytes 0\.\.1600, past the 16 bytes",
         lambda p: _safetensors(p, {"w": {**entry, "data_offsets": [0, 1600]}}, b"\0" * 16))
    case("st-shape-overflow", r"needs a shape of sizes|of shape \[",
         lambda p: _safetensors(p, {"w": {**entry, "shape": [2**62, 2**62, 2**62]}}, b"\0" * 16))
    case("st-overlap", r"starts at byte 8, expected 16 \(tensors overlap",
         lambda p: _safetensors(p, {"a": entry, "b": {**entry, "shape": [2], "data_offsets": [8, 16]}}, b"\0" * 16))
    case("st-utf8", r"its header is not UTF-8", lambda p: _safetensors(p, b'{"w\xff\xfe": 1}'))
    case("st-short", r"shorter than its 8-byte header length",
         lambda p: (p / "model.safetensors").write_bytes(b"\x01\x02"))
    case("tok-garbage", r"tokenizer\.json is not valid JSON", lambda p: (p / "tokenizer.json").write_text("garbage"))
    case("tok-empty-object", r"tokenizer\.json is not a tokenizer", lambda p: (p / "tokenizer.json").write_text("{}"))
    case("tok-deep", r"tokenizer\.json is nested too deeply",
         lambda p: (p / "tokenizer.json").write_text('{"model": ' + _nested(100_000) + "}"))
    case("tok-wrong-model", r"the tokenizer in .* cannot be loaded",
         lambda p: (p / "tokenizer.json").write_text('{"model": {"type": "Nope"}}'))
    return cases


def corpus_cases(root: Path) -> list[tuple[str, str, str]]:
    """(case, corpus argument, what the one line must say)."""
    os.mkfifo(root / "fifo.txt")
    (root / "zero.txt").symlink_to("/dev/zero")
    (root / "folder.txt").mkdir()
    (root / "deep.jsonl").write_text('{"text": "ok"}\n{"text": "x", "a": ' + _nested(100_000) + "}\n")
    (root / "surrogate.jsonl").write_text('{"text": "a \\ud800 b"}\n')
    (root / "nul.txt").write_bytes(b"text\x00more")
    (root / "loop-a.txt").symlink_to(root / "loop-b.txt")
    (root / "loop-b.txt").symlink_to(root / "loop-a.txt")
    return [
        ("fifo", str(root / "fifo.txt"), r"fifo\.txt is not a regular file \(a named pipe\)"),
        ("dev-zero", str(root / "zero.txt"), r"zero\.txt is not a regular file \(a character device\)"),
        ("folder", str(root / "folder.txt"), r"folder\.txt is not a regular file \(a folder\)"),
        ("deep-jsonl", str(root / "deep.jsonl"), r"deep\.jsonl:2 is nested too deeply"),
        ("surrogate", str(root / "surrogate.jsonl"), r"surrogate\.jsonl:1 has a lone surrogate"),
        ("nul", str(root / "nul.txt"), r"nul\.txt looks binary"),
        ("link-loop", str(root / "loop-a.txt"), r"loop-a\.txt cannot be read \(Too many levels of symbolic links\)"),
        ("name-too-long", str(root / ("c" * 300 + ".txt")), r"cannot be read \(File name too long\)"),
        ("path-too-long", "/".join(["d" * 200] * 30) + ".txt", r"cannot be read \(File name too long\)"),
    ]


def _run_table(cases: list[list[str]], tmp: Path) -> list[dict]:
    (tmp / "cases.json").write_text(json.dumps(cases))
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "lens" / "hostile_cli.py"), str(tmp / "cases.json"),
                           str(tmp / "results.json")], env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp / "results.json").read_text())


def _one_line(res: dict, expect: str) -> None:
    err = res["stderr"]
    assert res["rc"] == 2, res
    assert "Traceback" not in err and "internal error" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err!r}"
    assert err.startswith("lens: error: ") and re.search(expect, err), err


def test_hostile_files_end_as_one_line_exit_2(good_dir, tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "corpora").mkdir()
    models = model_cases(good_dir, tmp_path / "models")
    corpora = corpus_cases(tmp_path / "corpora")
    argvs = [["inspect", str(path)] for _, path, _ in models]
    argvs += [["capture", str(path), "--corpus", "lee", "--max-tokens", "64", "--out", str(tmp_path / f"out-m-{i}"),
               "--quiet"] for i, (_, path, _) in enumerate(models[:3])]
    argvs += [["capture", "tiny-llama", "--corpus", arg, "--max-tokens", "64", "--out", str(tmp_path / f"out-c-{i}"),
               "--quiet"] for i, (_, arg, _) in enumerate(corpora)]
    argvs += [["inspect", "m" * 5000], ["inspect", str(tmp_path / ("m" * 300))]]
    expects = ([e for _, _, e in models] + [e for _, _, e in models[:3]] + [e for _, _, e in corpora]
               + ["cannot be looked up \\(File name too long\\)"] * 2)
    results = _run_table(argvs, tmp_path)
    failures = []
    for res, expect in zip(results, expects, strict=True):
        try:
            _one_line(res, expect)
        except AssertionError as exc:
            failures.append(f"{res['argv'][:2]}: {exc}")
    assert not failures, "\n".join(failures)
    assert not (tmp_path / "models" / "UNPICKLED").exists()  # the pickle was never run
    assert not any(p.name.startswith("out-") for p in tmp_path.iterdir())  # nothing half-written


@pytest.mark.parametrize("argv", [["inspect", "{pickled}"], ["capture", "tiny-llama", "--corpus", "{fifo}",
                                                              "--out", "{out}", "--quiet"]])
def test_as_a_process_of_its_own(good_dir, tmp_path, argv):
    """The same through `python -m app`: what a user's shell sees, exit status and stderr."""
    pickled = _variant(good_dir, tmp_path, "pickled")
    (pickled / "model.safetensors").unlink()
    (pickled / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(tmp_path / "UNPICKLED")))
    os.mkfifo(tmp_path / "fifo.txt")
    argv = [a.format(pickled=pickled, fifo=tmp_path / "fifo.txt", out=tmp_path / "out") for a in argv]
    proc = subprocess.run([sys.executable, "-m", "app", *argv], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300)
    _one_line({"rc": proc.returncode, "stderr": proc.stderr}, r"pickled weights|not a regular file")
    assert not (tmp_path / "UNPICKLED").exists() and not (tmp_path / "out").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode: the unreadable-file path is "
                    "covered by the link-loop case of the table, the same OSError branch")
def test_unreadable_corpus(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text("words words")
    path.chmod(0)
    with pytest.raises(LensInputError, match=r"secret\.txt cannot be read \(Permission denied\)"):
        load_corpus(path)


# --------------------------------------------------------------------------- memory and the meta check
def test_memory_check_counts_on_meta_and_can_be_overridden(good_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(good_dir)
    cfg.intermediate_size = 8_000_000
    cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads = 4096, 32, 8
    with pytest.raises(LensInputError, match="needs [0-9.]+ GiB"):  # exact count, from the model built on meta
        check_memory(AutoModelForCausalLM, cfg, "cpu", "big", allow_large=False)
    check_memory(AutoModelForCausalLM, cfg, "cpu", "big", allow_large=True)  # the override: nothing is built
    small = AutoConfig.from_pretrained(good_dir)
    check_memory(AutoModelForCausalLM, small, "cpu", "small", allow_large=False)  # fits: no refusal
    model = lens.load_model(good_dir)  # a sound folder still loads, safetensors only
    assert model.n_layers == 2


def test_safetensors_check_accepts_what_safetensors_writes(good_dir, tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(3, 5), "b": torch.ones(2, dtype=torch.bfloat16), "c": torch.zeros(0)},
              tmp_path / "x.safetensors", metadata={"format": "pt"})
    check_safetensors(tmp_path / "x.safetensors")
    check_safetensors(good_dir / "model.safetensors")


# --------------------------------------------------------------------------- long lines, bounded memory
def _peak_rss_mb(argv: list[str]) -> float:
    proc = subprocess.Popen([sys.executable, "-m", "app", *argv], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, out.decode()[-2000:]
    return usage.ru_maxrss / 1024  # KiB on Linux


def _line(n_bytes: int) -> str:
    rng = np.random.default_rng(0)
    words = np.array(["river", "stone", "light", "of", "the", "north", "quietly", "seven", "glass", "ran"])
    chunk = " ".join(words[rng.integers(0, len(words), 20_000)]) + " "
    return chunk * (n_bytes // len(chunk) + 1)


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_one_long_line_costs_no_more_memory_than_a_short_file(tmp_path, suffix):
    """A 48 MB single-line document with --max-tokens 2000 peaks where a 30 KB file does (the whole file
    held would add at least its 48 MB, three times that as text and copies); by hand, 200 MB: see the report."""
    big, small = tmp_path / f"big{suffix}", tmp_path / f"small{suffix}"
    text = _line(48 << 20)
    if suffix == ".jsonl":
        big.write_text(json.dumps({"title": "one", "text": text}) + "\n")
        small.write_text(json.dumps({"text": text[:30_000]}) + "\n")
    else:
        big.write_text(text)
        small.write_text(text[:30_000])
    del text
    rss = {}
    for name, path in (("small", small), ("big", big)):
        rss[name] = _peak_rss_mb(["capture", "tiny-llama", "--corpus", str(path), "--max-tokens", "2000",
                                  "--out", str(tmp_path / f"store-{name}"), "--quiet"])
    assert rss["big"] - rss["small"] < 24, rss
    # the same tokens as the short file's (whose text is the long line's start) where their places meet: each
    # store is a spread sample of windows, drawn from the prefix tokenised
    a, b = lens.open_store(tmp_path / "store-small"), lens.open_store(tmp_path / "store-big")
    at = {int(p): int(t) for p, t in zip(a.tokens["doc_pos"], a.tokens["token_id"]) if p >= 0}
    end = max(at) - 200  # the short file's last tokens end where its text is cut
    both = [(at[int(p)], int(t)) for p, t in zip(b.tokens["doc_pos"], b.tokens["token_id"]) if 0 <= p < end and int(p) in at]
    assert a.n_tokens > 1000 and len(both) > 100 and all(x == y for x, y in both)


def test_long_document_tokens_are_the_whole_documents_first_tokens(tiny_llama):
    """The prefix path gives the ids whole-text tokenisation gives (a real tokenizer, a real long text)."""
    text = _line(1 << 20)[:(1 << 20)] + "\u00e9t\u00e9 \u65e5\u672c " * 1000
    doc = lens.Document(0, text)
    whole = np.asarray(tiny_llama.tokenizer(text, add_special_tokens=False)["input_ids"])
    for need in (10, 5000, 100_000):
        got = document_ids(tiny_llama.tokenizer, doc, need)
        assert len(got) >= need and np.array_equal(got, whole[:len(got)])
    corpus = lens.Corpus("one", (doc,))
    w = make_windows(corpus, tiny_llama.tokenizer, seq_len=64, max_tokens=3000, sample="first")
    assert w.n_tokens == 3000 and np.array_equal(np.concatenate(w.input_ids), whole[:3000])
    assert np.array_equal(w.rows["next_token_id"], whole[1:3001])
    w = make_windows(corpus, tiny_llama.tokenizer, seq_len=64, max_tokens=3000)  # spread: windows of a prefix
    assert w.n_tokens == 3000 and np.array_equal(w.rows["token_id"], whole[w.rows["doc_pos"]])
    assert np.array_equal(w.rows["next_token_id"], whole[w.rows["doc_pos"] + 1])


@pytest.mark.parametrize("block", [1, 3, 7, 4096])
def test_streamed_reading_equals_reading_the_whole_file(tmp_path, monkeypatch, block):
    """Documents and fingerprint as re.split / str.splitlines on the whole text give them, with tiny
    blocks (every boundary cut), documents left in the file (HOLD_BYTES 5) and lines streamed (LINE_LIMIT 9)."""
    import lens.text.files as cf

    monkeypatch.setattr(cf, "BLOCK", block)
    monkeypatch.setattr(cf, "HOLD_BYTES", 5)
    monkeypatch.setattr(cf, "LINE_LIMIT", 9)
    rng = np.random.default_rng(block)
    alphabet = ["a", "b", " ", "\n", "\r", "\t", "\u2028", "\x85", "\u00e9", "\u65e5", "\U0001F600", "\xa0", "\n\n",
                " \n \n"]

    def fingerprint(texts):
        h = hashlib.sha256()
        for t in texts:
            h.update(t.encode() + b"\x00")
        return h.hexdigest()[:16]

    for _ in range(60):
        body = "".join(rng.choice(alphabet, rng.integers(1, 50)))
        want = [p.strip() for p in re.split(r"\n\s*\n", body) if p.strip()]
        rows = [{"text": "".join(rng.choice(alphabet, rng.integers(0, 30))), "n": [1, {"x": "y\\"}], "title": "t"}
                for _ in range(3)]
        jbody = "\r\n".join(json.dumps(r, ensure_ascii=bool(rng.integers(2))).replace("\u2028", "\\u2028")
                            .replace("\x85", "\\u0085") for r in rows)
        jwant = [r["text"] for r in rows if r["text"].strip()]
        for path, content, expected in ((tmp_path / "c.txt", body, want), (tmp_path / "c.jsonl", jbody, jwant)):
            path.write_text(content, encoding="utf-8", newline="")
            if not expected:
                continue
            c = load_corpus(path)
            assert [d.text for d in c.documents] == expected, content
            assert c.fingerprint == fingerprint(expected)


def test_memory_check_counts_the_dtype_the_weights_are_loaded_in(good_dir):
    """A model whose float32 weights do not fit but whose bfloat16 ones do is loadable with
    --model-dtype bfloat16: the check counts 2 bytes a parameter then, not 4."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from lens.model.files import meta_params
    from lens.runtime.devices import available_bytes

    cfg = AutoConfig.from_pretrained(good_dir)
    have, _ = available_bytes("cpu")
    # gate, up and down projections: 3 x hidden parameters per intermediate unit and layer; ~have/3 in all
    cfg.intermediate_size = int(have / 3 / (3 * cfg.hidden_size * cfg.num_hidden_layers))
    n = meta_params(AutoModelForCausalLM, cfg)
    if not (2 * n < have < 4 * n):
        pytest.skip(f"could not size a model between the two dtypes here ({n} parameters, {have} bytes)")
    with pytest.raises(LensInputError, match="GiB for its float32 weights"):
        check_memory(AutoModelForCausalLM, cfg, "cpu", "big", allow_large=False)
    check_memory(AutoModelForCausalLM, cfg, "cpu", "big", allow_large=False, dtype="bfloat16")
    check_memory(AutoModelForCausalLM, cfg, "cpu", "big", allow_large=False, dtype=torch.bfloat16)
