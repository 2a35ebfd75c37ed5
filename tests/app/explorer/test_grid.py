"""The logit-lens token × layer grid (app/explorer/grid.py), built from saved arrays alone: on a real tiny-llama run
(its cells are the study's own top-1 and top-k), on a synthetic run, and on a result written before the
grid's arrays existed; and the deep link a cell carries into the Token view (app/explorer/links.py)."""

from __future__ import annotations

import math
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest

from app.explorer import grid
from app.explorer.links import metric_id, token_params, token_view_url
from studies.logit_lens.declaration import A


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from app.commands.cli import main
    from studies.reporting.results import read_result

    out = tmp_path_factory.mktemp("grid") / "ll"
    assert main(["study", "logit-lens", "--model", "tiny-llama", "--corpus", "lee", "--max-tokens", "256",
                 "--out", str(out), "--quiet", "--param", "topk_tokens=32"]) == 0
    return read_result(out)


def test_the_study_saves_a_compact_top_k_of_every_decoded_token(tiny_run):
    a, L, n = tiny_run.arrays(), len(tiny_run.layers), tiny_run.n_tokens
    k = tiny_run.config["grid_top_k"]
    assert a[A.grid_topk].shape == (L, len(a[A.token_index]), k) and a[A.grid_topk_probs].dtype == np.float16
    assert a[A.mid_grid_topk].shape == a[A.grid_topk].shape and a[A.token_entropy].shape == a[A.token_ce].shape
    # the grid's top-1 is the study's top-1, its top-k the first slots of the saved top-k (first rows)
    vocab = a[A.grid_vocab]
    np.testing.assert_array_equal(vocab[a[A.grid_topk][:, :, 0]], a[A.token_top1_str])
    np.testing.assert_array_equal(vocab[a[A.grid_topk][:, :32]], a[A.topk_str][:, :, :k])
    np.testing.assert_allclose(a[A.grid_topk_probs][:, :32].astype(np.float32), a[A.topk_probs][:, :, :k], atol=1e-3)
    assert a[A.topk_ids].shape == (L, 32, 10)  # the arrays saved before the grid: unchanged
    # compact: less than a text per cell would take
    cells = a[A.grid_topk].size
    assert a[A.grid_topk].nbytes + a[A.grid_topk_probs].nbytes + vocab.nbytes < cells * vocab.itemsize
    assert n >= len(a[A.token_index])


def test_a_grid_from_the_tiny_run(tiny_run):
    a = tiny_run.arrays()
    assert grid.lenses(a) == ["logit", "resid_mid"]
    wins = grid.windows(a)
    assert wins and wins[0]["start"] == 0 and all(w["stop"] > w["start"] for w in wins)
    assert sum(w["stop"] - w["start"] for w in wins) == len(a[A.token_index])
    w = wins[1]
    for lens in ("logit", "resid_mid"):
        for colour in grid.colours(a, lens):
            g = grid.build_grid(a, tiny_run.layers, lens=lens, colour=colour, start=w["start"], stop=w["start"] + 12)
            assert g.top1.shape == g.values.shape == (len(tiny_run.layers), 12)
            np.testing.assert_array_equal(g.rows, a[A.token_index][w["start"]:w["start"] + 12])
            np.testing.assert_array_equal(g.positions, a[A.pos][w["start"]:w["start"] + 12])
            assert np.all((g.shade[np.isfinite(g.shade)] >= 0) & (g.shade[np.isfinite(g.shade)] <= 1))
    g = grid.build_grid(a, tiny_run.layers, colour="ce", start=w["start"], stop=w["start"] + 12)
    np.testing.assert_array_equal(g.top1, a[A.token_top1_str][:, w["start"]:w["start"] + 12])
    np.testing.assert_allclose(g.values, a[A.token_ce][:, w["start"]:w["start"] + 12].astype(float))
    assert g.colour_title == "cross-entropy (nats)"
    top = a[A.grid_vocab][a[A.grid_topk][2, w["start"] + 3, 0]]
    assert f"{str(top)!r} " in g.hover[2, 3] and "cross-entropy:" in g.hover[2, 3] and "nats" in g.hover[2, 3]


def test_a_grid_from_a_synthetic_run(tmp_path):
    from tests.synthetic_runs import write_synthetic_run
    from studies.reporting.results import read_result

    write_synthetic_run(tmp_path, n_layers=5, n_tokens=120, studies={"logit-lens"})
    rec = read_result(tmp_path / "logit-lens")
    a = rec.arrays()
    assert [(w["start"], w["stop"]) for w in grid.windows(a)] == [(0, 50), (50, 100), (100, 120)]
    assert grid.lenses(a) == ["logit"]  # no resid_mid arrays saved
    g = grid.build_grid(a, rec.layers, colour="rank", start=50, stop=60)
    assert list(g.positions) == list(range(10)) and list(g.rows) == list(range(50, 60))
    assert g.colour_title == "rank of the true token (log10 of rank + 1)"
    words = a[A.grid_vocab]
    assert g.top1[4, 0] == words[(50 + 4) % len(words)]
    assert "0.400" in g.hover[4, 0] and "0.020" in g.hover[4, 0]  # the top-5's probabilities
    with pytest.raises(ValueError, match="unknown colour"):
        grid.build_grid(a, rec.layers, colour="loss")


def test_an_older_result_falls_back_to_top_1_and_the_first_rows_top_k(tmp_path):
    from tests.synthetic_runs import write_synthetic_run
    from studies.reporting.results import read_result

    write_synthetic_run(tmp_path, n_layers=4, n_tokens=100, topk_tokens=20, studies={"logit-lens"})
    a = read_result(tmp_path / "logit-lens").arrays()
    for key in (A.grid_topk, A.grid_topk_probs, A.grid_vocab, A.token_entropy):
        a.pop(key)
    assert grid.lenses(a) == ["logit"] and "entropy" not in grid.colours(a, "logit")
    g = grid.build_grid(a, [0, 1, 2, 3], colour="ce", start=10, stop=30)
    np.testing.assert_array_equal(g.top1, a[A.token_top1_str][:, 10:30])
    assert "0.400" in g.hover[0, 0]  # row 10 kept its top-k (the first 20 rows did)
    assert "0.400" not in g.hover[0, 15] and g.hover[0, 15].count("\n") == 2  # row 25: its top-1 alone


def test_a_cell_links_to_the_token_view_at_its_token_and_layer(tmp_path):
    from tests.synthetic_runs import write_synthetic_run
    from studies.reporting.results import read_result

    write_synthetic_run(tmp_path, n_layers=3, n_tokens=60, studies={"logit-lens"})
    rec = read_result(tmp_path / "logit-lens")
    g = grid.build_grid(rec.arrays(), rec.layers, colour="kl", start=50, stop=55)
    def href(layer, row, array):
        return token_view_url("synth", layer, row, metric_id("logit-lens", array))

    grids = [g] + [grid.build_grid(rec.arrays(), rec.layers, colour=c, start=50, stop=55) for c in ("ce", "rank")]
    d = grid.grid_payload(grids, href)
    assert (len(d["layers"]), len(d["pos"])) == (3, 5) and len(d["top"]) == 3 * 5 * d["k"]
    assert [c["key"] for c in d["colours"]] == ["kl", "ce", "rank"]  # the first is shown, the others a click away
    assert all(len(c["shade"]) == len(c["shown"]) == 3 * 5 for c in d["colours"])
    link = d["colours"][0]["href"].replace("{layer}", "1").replace("{row}", str(d["rows"][2]))  # as the page does
    href = "tokens?run=synth&layer=1&token=52&metric=logit-lens.token_kl"
    assert link == href and "metric=logit-lens.token_ce" in d["colours"][1]["href"]
    page = grid.grid_html(grids, lambda layer, row, array: token_view_url("synth", layer, row, array))
    assert "<script type=application/json>" in page and "class=lens-grid-wrap" in page
    with pytest.raises(ValueError, match="same tokens"):
        grid.grid_payload([g, grid.build_grid(rec.arrays(), rec.layers, colour="ce", start=50, stop=56)], href)
    query = {k: v[0] for k, v in parse_qs(urlparse(href).query).items()}
    assert query == token_params("synth", 1, 52, "logit-lens.token_kl")
    assert math.isfinite(g.low) and g.low <= g.high


def test_the_page_script_survives_the_sanitiser_and_hostile_token_texts(tmp_path):
    """Streamlit's sanitiser drops a script whose text has "<" before a word character, "/" or "!": the
    grid's own script has none, and token texts (any string a tokenizer holds) reach the page JSON-escaped."""
    import json
    import re

    from tests.synthetic_runs import write_synthetic_run
    from studies.reporting.results import read_result

    assert not re.search(r"<[/\w!]", grid._JS)
    write_synthetic_run(tmp_path, n_layers=3, n_tokens=60, studies={"logit-lens"})
    a = read_result(tmp_path / "logit-lens").arrays()
    hostile = np.array(["</script><img src=x onerror=alert(1)>", "<!--", "a&b", "\n", ""], dtype=str)
    a[A.grid_vocab] = hostile[np.arange(len(a[A.grid_vocab])) % len(hostile)]
    g = grid.build_grid(a, [0, 1, 2], colour="ce", start=0, stop=10)
    page = grid.grid_html([g], lambda layer, row, array: token_view_url("r</script>", layer, row, array))
    data = page.split("<script type=application/json>", 1)[1].split("</script>", 1)[0]
    assert not re.search(r"<[/\w!]", data) and "<" not in data
    payload = json.loads(data)
    assert set(payload["vocab"]) <= set(hostile) and payload["vocab_repr"] == [repr(v) for v in payload["vocab"]]
    assert page.count("</script>") == 2  # the payload's and the script's own
