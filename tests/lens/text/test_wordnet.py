"""WordNet sense contexts, span states and the steering hook (tiny-llama)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lens.errors import LensInputError


def _wordnet_or_skip():
    from lens.text import wordnet

    try:
        wordnet.find_wordnet()
    except LensInputError as e:
        pytest.skip(str(e))
    return wordnet


def test_no_wordnet_says_how_to_get_it(tmp_path, monkeypatch):
    from lens.text import wordnet

    monkeypatch.setenv("LENS_WORDNET_DIR", str(tmp_path))
    with pytest.raises(LensInputError, match="apt-get install wordnet-base"):
        wordnet.find_wordnet()
    with pytest.raises(LensInputError, match="make system-deps"):
        wordnet.sense_contexts(["bank"])


def test_sense_contexts_of_bank():
    wordnet = _wordnet_or_skip()
    ctx = wordnet.sense_contexts(["bank"])
    assert {c.lemma for c in ctx} == {"bank.n"}
    senses = {c.sense for c in ctx}
    assert len(senses) >= 2
    for c in ctx:
        assert c.text[c.start:c.end].lower().startswith("bank")
    counts = {s: sum(c.sense == s for c in ctx) for s in senses}
    assert min(counts.values()) >= 2


def test_inflected_forms_are_located():
    wordnet = _wordnet_or_skip()
    table = wordnet.all_sense_contexts()
    assert 600 < len(table) < 1200  # DESIGN: ~768 lemmas with >=2 senses of >=2 examples
    words = [c.text[c.start:c.end].lower() for cs in table.values() for c in cs]
    lemmas = [c.lemma.rsplit(".", 1)[0] for cs in table.values() for c in cs]
    assert any(w != l for w, l in zip(words, lemmas))  # e.g. "ran" for run.v, "banks" for bank.n


def test_bad_lemmas():
    wordnet = _wordnet_or_skip()
    with pytest.raises(LensInputError, match="not in WordNet"):
        wordnet.sense_contexts(["qwzxvbn"])
    with pytest.raises(LensInputError, match="fewer than 2 senses"):
        wordnet.sense_contexts(["bank.v"])
    with pytest.raises(LensInputError, match="max_lemmas"):
        wordnet.sense_contexts(max_lemmas=0)


def test_max_lemmas_is_seeded():
    wordnet = _wordnet_or_skip()
    a = wordnet.sense_contexts(max_lemmas=4, seed=3)
    b = wordnet.sense_contexts(max_lemmas=4, seed=3)
    assert a == b and len({c.lemma for c in a}) == 4


def test_span_states_match_hidden_states(tiny_llama):
    from lens.capturing.spans import span_states

    texts = ["he cashed a check at the bank today", "the banks"]
    spans = [(25, 29), (4, 9)]
    S = span_states(tiny_llama, texts, spans, batch_size=2)
    assert S.shape == (tiny_llama.n_layers + 1, 2, tiny_llama.d_model)
    enc = tiny_llama.tokenizer(texts[0], return_offsets_mapping=True)
    pos = [j for j, (s, e) in enumerate(enc["offset_mapping"]) if s < 29 and e > 25]
    with torch.no_grad():
        hs = tiny_llama.hf_model(torch.tensor([enc["input_ids"]]), output_hidden_states=True).hidden_states
    for l in range(tiny_llama.n_layers):  # hidden_states[l] is the input of block l (= output of l - 1)
        np.testing.assert_allclose(S[l, 0], hs[l][0, pos].mean(0).numpy(), atol=1e-5)
    with pytest.raises(LensInputError, match="span 0"):
        span_states(tiny_llama, ["abc"], [(2, 9)])


def test_steer_sets_the_coordinate_and_restores(tiny_llama):
    from lens.capturing.spans import last_token_states
    from lens.interventions.steering import next_token_logits, steer

    rng = np.random.default_rng(0)
    u = rng.normal(size=tiny_llama.d_model)
    prompts = ["a b c", "hello there my friend"]
    before = next_token_logits(tiny_llama, prompts)
    with torch.no_grad():
        full = tiny_llama.hf_model(torch.tensor([tiny_llama.tokenizer(prompts[1])["input_ids"]])).logits[0, -1]
    torch.testing.assert_close(before[1], full, atol=1e-4, rtol=1e-4)
    captured = {}

    def grab(module, args, out):
        captured["h"] = (out[0] if isinstance(out, tuple) else out).detach().clone()

    with steer(tiny_llama, 1, u, 7.5):
        h = tiny_llama.layers[1].register_forward_hook(grab)  # runs after the steering hook
        try:
            with torch.no_grad():
                tiny_llama.hf_model(torch.tensor([tiny_llama.tokenizer("a b c")["input_ids"]]))
        finally:
            h.remove()
    un = torch.tensor(u / np.linalg.norm(u), dtype=torch.float32)
    np.testing.assert_allclose((captured["h"][0] @ un).numpy(), 7.5, atol=1e-4)
    steered = next_token_logits(tiny_llama, prompts, steering=dict(layer=1, direction=u, value=50.0))
    assert float((steered - before).abs().max()) > 1e-3
    after = next_token_logits(tiny_llama, prompts)
    assert torch.equal(before, after)  # the hook is gone
    assert last_token_states(tiny_llama, prompts).shape == (tiny_llama.n_layers + 1, 2, tiny_llama.d_model)
    with pytest.raises(LensInputError, match="block index"):
        with steer(tiny_llama, 99, u, 1.0):
            pass
    with pytest.raises(LensInputError, match="d_model"):
        with steer(tiny_llama, 0, u[:3], 1.0):
            pass


@pytest.fixture(scope="module")
def reader():
    return _wordnet_or_skip().open_wordnet()


@pytest.mark.parametrize("pos", ["r", "a"])  # adverbs; adjectives with their satellites (same file)
def test_synsets_with_examples_are_all_synsets_with_examples_in_order(pos, reader):
    wordnet, wn = _wordnet_or_skip(), reader
    want = [(ss.name(), ss.examples(), ss.definition(), ss.lemma_names()) for ss in wn.all_synsets(pos)
            if ss.examples()]
    got = [(ss.name(), ss.examples(), ss.definition(), ss.lemma_names())
           for ss in wordnet._synsets_with_examples(wn, pos)]
    assert got == want and len(got) > 1000

    class Bare:  # an NLTK without the line parser: the plain all_synsets path
        all_synsets = staticmethod(wn.all_synsets)

    assert [ss.name() for ss in wordnet._synsets_with_examples(Bare(), pos)] == [g[0] for g in got]
    with pytest.raises(ValueError, match="pos"):
        next(wordnet._synsets_with_examples(wn, "s"))
