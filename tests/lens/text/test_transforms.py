import numpy as np
import pytest

import lens
from lens.text.corpora import make_windows
from lens.errors import LensInputError
from lens.text.transforms import CorpusTransform, parse_transform


def test_shuffle_keeps_the_multiset_of_tokens(tiny_llama):
    c = lens.load_corpus(["The cat sat on the mat, and the dog barked at it."])
    plain = make_windows(c, tiny_llama.tokenizer, seq_len=64)
    shuf = make_windows(c, tiny_llama.tokenizer, seq_len=64, transform=parse_transform("shuffle"))
    assert sorted(plain.rows["token_id"]) == sorted(shuf.rows["token_id"])
    assert not np.array_equal(plain.rows["token_id"], shuf.rows["token_id"])


def test_filler_removal_and_its_random_control_remove_the_same_count(tiny_llama):
    c = lens.load_corpus(["The cat sat on the mat, and the dog barked at it. A bird sang."])
    plain = make_windows(c, tiny_llama.tokenizer, seq_len=64).n_tokens
    rm = make_windows(c, tiny_llama.tokenizer, seq_len=64, transform=parse_transform("remove:punctuation,determiner"))
    rr = make_windows(c, tiny_llama.tokenizer, seq_len=64, transform=parse_transform("remove-random:punctuation,determiner"))
    assert rm.n_tokens == rr.n_tokens < plain
    texts = [tiny_llama.tokenizer.decode([int(i)]).strip() for i in rm.rows["token_id"]]
    assert "," not in texts and "." not in texts and "the" not in [t.lower() for t in texts]


def test_truncate_and_prepend(tiny_llama):
    c = lens.load_corpus(["one two three four five six seven eight nine ten"])
    t = make_windows(c, tiny_llama.tokenizer, seq_len=64, transform=parse_transform("truncate:3"))
    assert t.n_tokens == 3
    p = make_windows(c, tiny_llama.tokenizer, seq_len=64, transform=parse_transform("prepend:Paris is in Italy."))
    assert tiny_llama.tokenizer.decode(p.input_ids[0]).startswith("Paris is in Italy.")


def test_transform_recorded_in_manifest_and_settings(tiny_llama, tmp_path):
    s = lens.capture(tiny_llama, corpus="lee", max_tokens=200, transform="shuffle", out=tmp_path / "s", progress=False)
    assert s.manifest["corpus"]["transform"] == {"kind": "shuffle", "seed": 0}
    with pytest.raises(LensInputError, match="other settings.*transform"):
        lens.capture(tiny_llama, corpus="lee", max_tokens=200, out=tmp_path / "s", progress=False, resume=True)


def test_bad_transforms(tiny_llama):
    with pytest.raises(LensInputError, match="unknown transform"):
        parse_transform("explode")
    with pytest.raises(LensInputError, match="unknown token class"):
        parse_transform("remove:adjectives")
    with pytest.raises(LensInputError, match="emptied 1 documents"):
        make_windows(lens.load_corpus([", . ;"]), tiny_llama.tokenizer, seq_len=32,
                     transform=CorpusTransform("remove", classes=("punctuation",)))
