"""How probe studies draw their sample and the units their splits keep together (studies/core/sampling.py)."""

import numpy as np

from studies.core.sampling import sample_split_units, split_units


def _tokens(doc_lengths, window=128):
    doc = np.repeat(np.arange(len(doc_lengths)), doc_lengths)
    pos_in_doc = np.concatenate([np.arange(n) for n in doc_lengths])
    return {"doc": doc, "window": pos_in_doc // window, "pos": pos_in_doc % window}


def test_long_documents_fall_back_to_windows_when_the_sample_holds_too_few():
    """20 documents of 3000 tokens: the store has enough documents for a split by document, but a
    4000-token sample of whole documents holds two; windows are drawn instead, and said so."""
    tok = _tokens([3000] * 20)
    keep = np.ones(len(tok["doc"]), bool)
    assert split_units(tok, "auto", 10)[1] == "doc"
    rows, units, kind = sample_split_units(tok, keep, "auto", 10, 4000, seed=0)
    assert kind == "window" and 4000 <= len(rows) < 4000 + 128
    assert len(np.unique(units[rows])) >= 10 and len(np.unique(tok["doc"][rows])) > 2
    assert np.all(np.diff(rows) > 0)
    # asked for documents by name: documents, however few the sample holds
    rows, units, kind = sample_split_units(tok, keep, "doc", 10, 4000, seed=0)
    assert kind == "doc" and len(np.unique(units[rows])) == 2


def test_short_documents_keep_the_document_split():
    tok = _tokens([150] * 60)
    keep = np.ones(len(tok["doc"]), bool)
    keep[tok["pos"] == 0] = False  # rows a study leaves out are never drawn
    rows, units, kind = sample_split_units(tok, keep, "auto", 10, 2000, seed=3)
    assert kind == "doc" and len(np.unique(units[rows])) >= 10 and keep[rows].all()
    again = sample_split_units(tok, keep, "auto", 10, 2000, seed=3)
    assert np.array_equal(rows, again[0])  # seeded
