"""A sample that spans the corpus (issue 37): ``make_windows(..., sample="spread")`` draws whole windows from
every document in turn; ``sample="first"`` keeps the first ``max_tokens`` tokens, as before."""

import json

import numpy as np
import pytest

import lens
from lens.errors import LensInputError
from lens.text.corpora import Corpus, make_windows
from lens.text.files import Document


@pytest.fixture(scope="module")
def wiki():
    return lens.load_corpus("wiki-sample")


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return tiny_llama.tokenizer  # SmolLM2's tokenizer: the windows of smollm2-135m


def _same(a, b) -> bool:
    return (len(a.input_ids) == len(b.input_ids) and all(np.array_equal(x, y) for x, y in zip(a.input_ids, b.input_ids))
            and set(a.rows) == set(b.rows) and all(np.array_equal(a.rows[k], b.rows[k]) for k in a.rows))


def _check_rows(corpus, tok, w) -> None:
    """Every window is one run of rows of one document, numbered 0, 1, ... in (document, place) order,
    and each token's doc_pos / next_token_id are those of the whole document's tokenisation."""
    r, off = w.rows, w.window_offsets()
    texts = {d.doc_id: d.text for d in corpus.documents}
    whole = {}
    keys = []
    for k in range(w.n_windows):
        sl = slice(off[k], off[k + 1])
        doc = int(r["doc"][sl][0])
        assert (r["doc"][sl] == doc).all() and (r["window"][sl] == k).all()
        assert np.array_equal(r["pos"][sl], np.arange(off[k + 1] - off[k]))
        if doc not in whole:
            whole[doc] = np.asarray(tok(texts[doc], add_special_tokens=False)["input_ids"])
        ids = whole[doc]
        dp = r["doc_pos"][sl]
        real = dp >= 0
        assert np.array_equal(np.diff(dp[real]), np.ones(real.sum() - 1))
        assert np.array_equal(ids[dp[real]], r["token_id"][sl][real])
        assert np.array_equal(np.append(ids[1:], -1)[dp[real]], r["next_token_id"][sl][real])
        keys.append((doc, int(dp[real][0])))
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


def test_spread_sample_of_wiki_sample_spans_the_corpus(wiki, tok):
    first = make_windows(wiki, tok, seq_len=128, max_tokens=20_000, sample="first")
    spread = make_windows(wiki, tok, seq_len=128, max_tokens=20_000)  # the default
    assert len(np.unique(first.rows["doc"])) <= 2  # "Anarchism", "Autism"
    docs, counts = np.unique(spread.rows["doc"], return_counts=True)
    assert len(docs) >= 20
    assert len(docs) == len(wiki.documents)  # 160 windows over 106 documents: every one
    assert counts.max() <= 2 * 128  # no document gives more than its share (one or two windows)
    assert 20_000 - 128 < spread.n_tokens <= 20_000
    assert all(len(x) <= 128 for x in spread.input_ids)
    _check_rows(wiki, tok, spread)


def test_spread_is_deterministic_and_seeded(wiki, tok):
    a = make_windows(wiki, tok, seq_len=64, max_tokens=5000, sample_seed=3)
    b = make_windows(wiki, tok, seq_len=64, max_tokens=5000, sample_seed=3)
    c = make_windows(wiki, tok, seq_len=64, max_tokens=5000, sample_seed=4)
    assert _same(a, b)
    assert not _same(a, c)
    pairs = lambda w: set(zip(w.rows["doc"].tolist(), w.rows["doc_pos"].tolist()))  # noqa: E731
    assert pairs(a) != pairs(c)
    assert a.rows["window"].tolist() == sorted(a.rows["window"].tolist())


def test_first_sample_is_the_first_tokens(wiki, tok):
    w = make_windows(wiki, tok, seq_len=128, max_tokens=1000, sample="first")
    ids = np.asarray(tok(wiki.documents[0].text, add_special_tokens=False)["input_ids"])
    assert w.n_tokens == 1000 and (w.rows["doc"] == wiki.documents[0].doc_id).all()
    assert np.array_equal(w.rows["doc_pos"], np.arange(1000))
    assert np.array_equal(w.rows["token_id"], ids[:1000])
    assert np.array_equal(w.rows["window"], np.arange(1000) // 128)


def test_a_corpus_smaller_than_max_tokens_is_taken_whole(tok):
    corpus = lens.load_corpus(["The first short text of two.", "A second text, also short, but a little longer."])
    for sample in ("spread", "first"):
        w = make_windows(corpus, tok, seq_len=8, max_tokens=10_000, sample=sample, sample_seed=5)
        assert _same(w, make_windows(corpus, tok, seq_len=8))  # everything, as without max_tokens
    _check_rows(corpus, tok, w)


def test_one_document(wiki, tok):
    one = Corpus("one", (wiki.documents[1],))
    w = make_windows(one, tok, seq_len=64, max_tokens=3000)
    assert 3000 - 64 < w.n_tokens <= 3000
    _check_rows(one, tok, w)
    # drawn from more than the first 3000 tokens of the document, not all of them in one run
    assert w.rows["doc_pos"].max() > 3000
    assert not _same(w, make_windows(one, tok, seq_len=64, max_tokens=3000, sample="first"))


def test_three_documents_share_the_sample(wiki, tok):
    three = Corpus("three", wiki.documents[:3])
    w = make_windows(three, tok, seq_len=128, max_tokens=20_000)
    docs, counts = np.unique(w.rows["doc"], return_counts=True)
    # the third article holds fewer than a third of the tokens: it gives all of them, the others the rest
    short = len(tok(three.documents[2].text, add_special_tokens=False)["input_ids"])
    assert len(docs) == 3 and short < 20_000 / 3 and counts[2] == short
    assert abs(int(counts[0]) - int(counts[1])) <= 2 * 128
    _check_rows(three, tok, w)


def test_a_short_document_leaves_its_share_to_the_others(wiki, tok):
    corpus = Corpus("mixed", (Document(0, "Just a few words here."),) + tuple(
        Document(i + 1, d.text) for i, d in enumerate(wiki.documents[:2])))
    w = make_windows(corpus, tok, seq_len=64, max_tokens=8000)
    assert 8000 - 64 < w.n_tokens <= 8000
    docs, counts = np.unique(w.rows["doc"], return_counts=True)
    assert docs.tolist() == [0, 1, 2] and counts[0] < 10
    _check_rows(corpus, tok, w)


def test_max_tokens_shorter_than_a_window(wiki, tok):
    w = make_windows(wiki, tok, seq_len=128, max_tokens=50)
    assert w.n_windows == 1 and w.n_tokens == 50
    _check_rows(wiki, tok, w)


def test_encoder_windows_keep_cls_and_sep(tiny_bert):
    corpus = lens.load_corpus("lee")
    w = make_windows(corpus, tiny_bert.tokenizer, seq_len=16, max_tokens=160, is_causal=False)
    assert len(np.unique(w.rows["doc"])) == 10 and w.n_tokens == 160
    for x in w.input_ids:
        assert x[0] == tiny_bert.tokenizer.cls_token_id and x[-1] == tiny_bert.tokenizer.sep_token_id


def test_spread_tokenises_only_what_it_may_draw(tmp_path, tok):
    """100,000 documents: a sample of 2,000 tokens reads about as many documents as it takes windows."""
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join(json.dumps({"text": f"document {i}: " + "some words of text " * 30})
                              for i in range(100_000)))
    corpus = lens.load_corpus(path)
    calls = []

    def counting(text, **kw):
        calls.append(len(text))
        return tok(text, **kw)

    w = make_windows(corpus, counting, seq_len=128, max_tokens=2000)
    assert len(np.unique(w.rows["doc"])) == w.n_windows >= 15
    assert len(calls) <= 2 * w.n_windows


def test_a_long_document_is_tokenised_a_prefix_at_a_time(tok):
    """One document of 2 million characters: the spread sample of 2,000 tokens tokenises a prefix of it."""
    text = " ".join(f"word{i % 1000}" for i in range(300_000))
    calls = []

    def counting(t, **kw):
        calls.append(len(t))
        return tok(t, **kw)

    w = make_windows(lens.load_corpus([text]), counting, seq_len=128, max_tokens=2000)
    assert 2000 - 128 < w.n_tokens <= 2000
    assert max(calls) < len(text) // 4


def test_transform_on_a_spread_sample(wiki, tok):
    from lens.text.transforms import parse_transform

    w = make_windows(wiki, tok, seq_len=64, max_tokens=4000, transform=parse_transform("shuffle"))
    plain = make_windows(wiki, tok, seq_len=64, max_tokens=4000)
    assert np.array_equal(w.rows["doc"], plain.rows["doc"]) and w.n_tokens == plain.n_tokens


def test_bad_sample_is_refused(wiki, tok):
    with pytest.raises(LensInputError, match="sample must be spread or first"):
        make_windows(wiki, tok, max_tokens=100, sample="random")
    with pytest.raises(LensInputError, match="sample_seed must be an integer >= 0"):
        make_windows(wiki, tok, max_tokens=100, sample_seed=-1)


# --------------------------------------------------------------------------- the sample in a store
KW = dict(corpus="lee", max_tokens=300, seq_len=32, batch_size=2, shard_tokens=64, sites=["resid_post"],
          progress=False)


def _cli(argv, capsys) -> tuple[int, str, str]:
    from app.commands.cli import main

    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _argv(out, *more) -> list:
    return ["capture", "tiny-llama", "--corpus", "lee", "--max-tokens", "300", "--seq-len", "32", "--batch-size", "2",
            "--shard-tokens", "64", "--sites", "resid_post", "--quiet", "--out", out, *more]


def _drop_last_shard(root) -> None:
    import shutil

    from lens.store.format import commit_manifest

    m = json.loads((root / "manifest.json").read_text())
    last = m["shards"].pop()
    shutil.rmtree(root / "shards" / last["name"])
    m["n_tokens"] -= last["n_tokens"]
    m["nonfinite"] = {s: [a - b for a, b in zip(c, last["nonfinite"][s])] for s, c in m["nonfinite"].items()}
    m["complete"] = False
    commit_manifest(root, m)


def test_the_manifest_records_the_sample(tiny_llama, tmp_path, capsys, monkeypatch):
    from lens.store.format import store_sample

    spread = lens.capture(tiny_llama, out=tmp_path / "spread", **KW)
    first = lens.capture(tiny_llama, out=tmp_path / "first", sample="first", **KW)
    seeded = lens.capture(tiny_llama, sample_seed=7, **KW)  # in memory
    assert spread.manifest["sample"] == "spread" and spread.manifest["sample_seed"] == 0
    assert spread.manifest["settings"]["sample"] == "spread" and spread.manifest["settings"]["sample_seed"] == 0
    assert store_sample(seeded.manifest) == ("spread", 7)
    # a first sample's settings (and fingerprint) are those of a store from before samples were recorded
    assert first.manifest["sample"] == "first" and "sample" not in first.manifest["settings"]
    assert store_sample(first.manifest) == ("first", None)
    assert len(np.unique(spread.tokens["doc"])) > len(np.unique(first.tokens["doc"]))
    monkeypatch.setattr(lens, "load_model", lambda *a, **k: tiny_llama)
    rc, out, err = _cli(["store", "info", tmp_path / "spread", "--no-stats"], capsys)
    assert rc == 0 and "sample     spread (seed 0), max_tokens 300" in out, err
    rc, out, _ = _cli(["store", "info", tmp_path / "first", "--no-stats"], capsys)
    assert rc == 0 and "sample     first, max_tokens 300" in out


def test_a_store_from_before_holds_the_first_tokens(tiny_llama, tmp_path, capsys, monkeypatch):
    from lens.store.format import commit_manifest, store_sample

    monkeypatch.setattr(lens, "load_model", lambda *a, **k: tiny_llama)
    ref = tmp_path / "ref"
    assert _cli(_argv(ref, "--sample", "first"), capsys)[0] == 0
    old = tmp_path / "old"
    import shutil

    shutil.copytree(ref, old)
    m = json.loads((old / "manifest.json").read_text())
    del m["sample"]  # as a store written before samples were recorded
    commit_manifest(old, m)
    _drop_last_shard(old)
    assert store_sample(lens.open_store(old).manifest) == ("first", None)
    rc, _, err = _cli(_argv(old, "--resume"), capsys)  # the default sample is spread: not this store's
    assert rc == 2 and "sample: store has 'first', this run has 'spread'" in err and "--sample first" in err
    rc, _, err = _cli(_argv(old, "--resume", "--sample", "first"), capsys)
    assert rc == 0, err
    assert np.array_equal(lens.open_store(old).tokens["token_id"], lens.open_store(ref).tokens["token_id"])


def test_a_spread_store_resumes_exactly_and_not_as_another_seed(tiny_llama, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(lens, "load_model", lambda *a, **k: tiny_llama)
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    assert _cli(_argv(ref, "--sample-seed", "3"), capsys)[0] == 0
    import shutil

    shutil.copytree(ref, cut)
    _drop_last_shard(cut)
    rc, _, err = _cli(_argv(cut, "--resume"), capsys)
    assert rc == 2 and "sample_seed: store has 3, this run has 0" in err and "--sample-seed 3" in err
    rc, _, err = _cli(_argv(cut, "--resume", "--sample-seed", "3"), capsys)
    assert rc == 0, err
    for name in ("tokens.doc_pos.npy", "tokens.token_id.npy", "resid_post.npy"):
        for shard in sorted(p.name for p in (ref / "shards").iterdir()):
            assert (cut / "shards" / shard / name).read_bytes() == (ref / "shards" / shard / name).read_bytes()


def test_parts_of_different_samples_are_not_merged(tiny_llama, tmp_path, capsys):
    for i in (1, 2):
        lens.capture(tiny_llama, out=tmp_path / f"p{i}", part=f"{i}/2", **KW)
    lens.capture(tiny_llama, out=tmp_path / "first-p2", part="2/2", sample="first", **KW)
    lens.capture(tiny_llama, out=tmp_path / "seed-p2", part="2/2", sample_seed=1, **KW)
    rc, _, err = _cli(["store", "merge", tmp_path / "p1", tmp_path / "first-p2", "--out", tmp_path / "m"], capsys)
    assert rc == 2 and "sample: " in err and "'spread'" in err and "'first'" in err
    rc, _, err = _cli(["store", "merge", tmp_path / "p1", tmp_path / "seed-p2", "--out", tmp_path / "m"], capsys)
    assert rc == 2 and "sample_seed: " in err and not (tmp_path / "m").exists()
    rc, _, err = _cli(["store", "merge", tmp_path / "p1", tmp_path / "p2", "--out", tmp_path / "m", "--quiet"], capsys)
    assert rc == 0, err
    merged, single = lens.open_store(tmp_path / "m"), lens.capture(tiny_llama, **KW)
    assert merged.manifest["sample"] == "spread" and merged.manifest["settings"]["sample_seed"] == 0
    assert np.array_equal(merged.tokens["doc_pos"], single.tokens["doc_pos"])


def test_a_manifest_with_a_bad_sample_is_damaged(tiny_llama, tmp_path):
    from lens.errors import StoreCorruptError
    from lens.store.format import commit_manifest

    lens.capture(tiny_llama, out=tmp_path / "s", **KW)
    m = json.loads((tmp_path / "s" / "manifest.json").read_text())
    m["sample"] = "middle"
    commit_manifest(tmp_path / "s", m)
    with pytest.raises(StoreCorruptError, match="sample must be spread or first"):
        lens.open_store(tmp_path / "s")
