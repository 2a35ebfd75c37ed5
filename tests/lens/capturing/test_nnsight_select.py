"""NDIF requests bring back only the real tokens of the requested sites, and are sized before sending.

Tested with nnsight's local execution (``select=True`` runs the server-side selection locally).
"""

from __future__ import annotations

import pytest
import torch

from lens.capturing.backends import make_backend
from lens.errors import LensInputError
from lens.sites import HookSite, Site


def test_selected_tokens_equal_native_and_the_request_is_sized(tiny_llama, monkeypatch):
    hooks = [HookSite(Site.EMBED, None), HookSite(Site.RESID_POST, 1), HookSite(Site.ATTN_OUT, 3)]
    ids = torch.randint(5, 1000, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 3:] = 0
    engine = make_backend("nnsight", tiny_llama, hooks, select=True)
    want, _ = make_backend("native", tiny_llama, hooks).run(ids, mask)
    got, _ = engine.run(ids, mask)
    keep = mask.bool()
    for h in hooks:
        torch.testing.assert_close(got[h.key][keep], want[h.key][keep], atol=1e-5, rtol=0)
        assert not got[h.key][~keep].any()  # padding did not travel: rebuilt as zeros
    n_real = int(mask.sum())
    assert engine.estimate_bytes(n_real) == n_real * 3 * tiny_llama.d_model * 4
    monkeypatch.setenv("LENS_NDIF_MAX_MB", str(engine.estimate_bytes(n_real) / 2**20 / 2))
    with pytest.raises(LensInputError, match=r"over the .* limit \(LENS_NDIF_MAX_MB\): use --batch-size 1"):
        engine.run(ids, mask)
