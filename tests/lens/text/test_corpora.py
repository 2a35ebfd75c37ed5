import numpy as np
import pytest

import lens
from lens.text.corpora import make_windows
from lens.errors import LensInputError


def test_builtin_corpora_are_clean_text():
    wiki = lens.load_corpus("wiki-sample")
    assert len(wiki.documents) > 50
    text = wiki.documents[0].text
    assert "'''" not in text and "[[" not in text and "{{" not in text
    lee = lens.load_corpus("lee")
    assert len(lee.documents) == 300


def test_txt_and_jsonl(tmp_path):
    (tmp_path / "a.txt").write_text("First doc here.\nStill first.\n\n\nSecond doc.\n")
    c = lens.load_corpus(tmp_path / "a.txt")
    assert [d.text for d in c.documents] == ["First doc here.\nStill first.", "Second doc."]
    (tmp_path / "b.jsonl").write_text('{"text": "one"}\n\n{"text": "two", "title": "t"}\n')
    assert [d.text for d in lens.load_corpus(tmp_path / "b.jsonl").documents] == ["one", "two"]
    (tmp_path / "bad.jsonl").write_text('{"txt": "one"}\n')
    with pytest.raises(LensInputError, match="bad.jsonl:1 has no string 'text'"):
        lens.load_corpus(tmp_path / "bad.jsonl")


@pytest.mark.parametrize("content,match", [(b"", "empty"), (b"  \n\n ", "empty"),
                                           (b"\x00\x01\x02binary\x00", "binary"),
                                           (b"\xff\xfe\xfa caf\xe9", "not UTF-8")])
def test_bad_corpus_files(tmp_path, content, match):
    path = tmp_path / "c.txt"
    path.write_bytes(content)
    with pytest.raises(LensInputError, match=match):
        lens.load_corpus(path)


def test_unknown_and_missing(tmp_path):
    with pytest.raises(LensInputError, match="unknown corpus"):
        lens.load_corpus("no-such-corpus")
    with pytest.raises(LensInputError, match="not found"):
        lens.load_corpus(tmp_path / "missing.txt")


def test_windows_are_deterministic_capped_and_keep_positions(tiny_llama):
    c = lens.load_corpus("lee")
    a = make_windows(c, tiny_llama.tokenizer, seq_len=32, max_tokens=1000)
    b = make_windows(c, tiny_llama.tokenizer, seq_len=32, max_tokens=1000)
    assert a.n_tokens == 1000 and all(len(w) <= 32 for w in a.input_ids)
    for k in a.rows:
        assert np.array_equal(a.rows[k], b.rows[k])
    # next token is the following token of the same document, across window boundaries
    rows = a.rows
    same_doc = rows["doc"][1:] == rows["doc"][:-1]
    assert np.array_equal(rows["next_token_id"][:-1][same_doc], rows["token_id"][1:][same_doc])
    assert np.all(np.diff(rows["doc_pos"])[same_doc] == 1)
    assert rows["pos"].max() == 31


def test_encoder_windows_carry_cls_and_sep(tiny_bert):
    w = make_windows(lens.load_corpus("lee"), tiny_bert.tokenizer, seq_len=16, max_tokens=64, is_causal=False)
    first = w.input_ids[0]
    assert first[0] == tiny_bert.tokenizer.cls_token_id and first[-1] == tiny_bert.tokenizer.sep_token_id
    assert w.rows["special"][0] and w.rows["special"][15] and not w.rows["special"][1:15].any()
