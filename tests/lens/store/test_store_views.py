"""Store views: the one lazy per-layer reader and the one token mask every analysis uses."""

import numpy as np
import pytest
import torch

import lens
from lens.errors import LensInputError


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return lens.capture("tiny-llama", corpus="lee", sites=["resid_post", "embed"], layers="0,1,3", max_tokens=300,
                        seq_len=64, dtype="float16", out=tmp_path_factory.mktemp("views") / "s", progress=False)


def test_view_reads_each_layer_lazily_by_position_and_by_id(store, monkeypatch):
    reads = []
    real = type(store).get
    monkeypatch.setattr(type(store), "get", lambda self, *a, **k: reads.append(a or k) or real(self, *a, **k))
    view = store.view("resid_post")
    assert reads == [] and view.layers == [0, 1, 3] and len(view) == 3 and view.n_tokens == 300
    third, by_id = view[2], view.at(3)
    assert len(reads) == 2  # one read per access, nothing read up front
    assert torch.equal(third, store.get("resid_post", 3)) and torch.equal(by_id, third)


def test_rows_and_dtype_compose(store):
    mask = np.zeros(store.n_tokens, bool)
    mask[[5, 7, 11, 200]] = True
    view = store.view("resid_post", layers=[1, 3]).astype(torch.float32).take(mask)
    assert view.n_tokens == 4 and view[0].dtype == torch.float32
    assert torch.equal(view.at(3), store.get("resid_post", 3)[[5, 7, 11, 200]].float())
    sub = view.take([1, 3])  # rows of the view, not of the store
    assert torch.equal(sub.at(1), store.get("resid_post", 1)[[7, 200]].float())
    loaded = sub.load()
    assert list(loaded) == [1, 3] and torch.equal(loaded[3], sub[1])


def test_lazy_layers_read_only_the_rows_indexed(store, monkeypatch):
    """``view.lazy()[l][rows]`` reads those rows of that layer (of the view's own rows), nothing up front,
    never the whole layer of a disk store."""
    view = store.view("resid_post", layers=[1, 3]).astype(torch.float32).take(np.arange(10, 110))
    full, full1 = store.get("resid_post", 3).float(), store.get("resid_post", 1).float()
    reads = []
    real = type(store).get
    monkeypatch.setattr(type(store), "get", lambda self, *a, **k: reads.append(k.get("rows")) or real(self, *a, **k))
    lazy = view.lazy()
    assert reads == [] and list(lazy) == [1, 3] and len(lazy[3]) == 100
    assert torch.equal(lazy[3][5:9], full[15:19])
    assert torch.equal(lazy[3][np.array([0, 99])], full[[10, 109]])
    assert torch.equal(lazy[3][torch.tensor([2, 1])], full[[12, 11]])
    mask = np.zeros(100, bool)
    mask[[3, 4]] = True
    assert torch.equal(lazy[1][mask], full1[[13, 14]])
    assert all(r is not None and len(r) <= 4 for r in reads)  # only the rows indexed were read
    with pytest.raises(TypeError, match="1-D"):
        lazy[3][np.zeros((2, 2), int)]


def test_missing_layers_and_sites_say_what_the_store_has(store):
    with pytest.raises(LensInputError, match=r"lacks layers \[2\] of resid_post \(has \[0, 1, 3\]\)"):
        store.view("resid_post", layers=[0, 2])
    with pytest.raises(LensInputError, match="site 'mlp_out' is not in this store"):
        store.view("mlp_out")


def test_token_mask_drops_special_tokens_and_early_positions(store):
    from lens.store.views import token_mask

    table = {"token_id": np.arange(6), "special": np.array([1, 0, 0, 1, 0, 0], bool),
             "pos": np.array([0, 1, 2, 0, 1, 2])}
    assert token_mask(table).tolist() == [False, True, True, False, True, True]
    assert token_mask(table, drop_special=False).all()
    assert token_mask(table, min_pos=2).tolist() == [False, False, True, False, False, True]
    with pytest.raises(LensInputError, match="none of the store's 6 tokens is left"):
        token_mask(table, min_pos=3)
    np.testing.assert_array_equal(store.mask(min_pos=1), token_mask(store.tokens, min_pos=1))
