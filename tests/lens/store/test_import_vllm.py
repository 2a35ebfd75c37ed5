"""vLLM's hidden-states files imported as a checked store.

vLLM does not install on CPU within CI's time (GPU wheels), so the files are built from the layout in vLLM's
source, vllm-project/vllm at 015a95c8bdd8f038e629e03d0dde955f7cec036b,
vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py:
``ExampleHiddenStatesConnector._submit_async_write`` builds ``{"hidden_states": pinned_hs, "token_ids": ...}``
(line 416) from ``extract_from_kv_cache`` (line 36-45: ``kv_cache[slot // block_size, :, slot % block_size]`` of a
``[num_blocks, num_heads, block_size, head_size]`` cache, line 319, the "heads" the layer ids of
``eagle_aux_hidden_state_layer_ids``, line 198): (token, layer id, hidden); ``_write_tensors`` writes it with
``safetensors.torch.save_file`` (line 343) to ``<request id>.safetensors`` (line 497) beside a ``.lock`` (line 431).
The connector's first version (commit 806715ec00d5c072a4d1e327b3c3a0c2c445bd7a, same path, line 50-63:
``reshape_hidden_states_from_kv_cache`` ends in ``torch.stack(hidden_states, dim=0)``) wrote (layer id, token,
hidden); those files are read too. Layer id ``i`` is the state before decoder layer ``i``
(vllm/model_executor/models/interfaces.py, ``EagleModelMixin._maybe_add_hidden_state``, called with 0 before the
first layer and ``l + 1`` after layer ``l``), Hugging Face's ``hidden_states[i]``. A planted one-layer shift is
refused by the fidelity check.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lens
from lens.capturing.exchange import import_store
from lens.errors import LensInputError, SilentlyWrong
from tests.lens.store.exchange_helpers import cli, nothing_at, one_error_line

TEXTS = ["The quick brown fox jumps over the lazy dog near the river bank.",
         "Stores of hidden states can come from a serving engine.",
         "A third request, somewhat longer than the others, so that windows differ in length across files."]


def write_vllm_files(model, folder, ids=(1, 2, 3), shift: int = 0, dtype=torch.bfloat16, lock=True,
                     layer_first=False):
    """One file per request, as the connector writes them; ``shift``: read hidden_states[i + shift] instead;
    ``layer_first``: as the connector's first version stacked them, (layer id, token, hidden)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    for r, text in enumerate(TEXTS):
        token_ids = torch.tensor(model.tokenizer(text)["input_ids"], dtype=torch.long)
        with torch.inference_mode():
            out = model.hf_model(input_ids=token_ids[None], output_hidden_states=True)
        hs = torch.stack([out.hidden_states[i + shift][0] for i in ids], dim=0 if layer_first else 1).to(dtype)
        path = folder / f"cmpl-{r:04d}-0.safetensors"
        save_file({"hidden_states": hs.contiguous(), "token_ids": token_ids}, str(path))
        if lock:
            (folder / f"{path.name}.lock").write_bytes(b"")  # vLLM's write lock, left beside the file
    return folder


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vllm_files_become_a_verified_store(tiny_llama, tmp_path, dtype):
    src = write_vllm_files(tiny_llama, tmp_path / "hs", dtype=dtype)
    out = import_store(src, "vllm", tmp_path / "s", model=tiny_llama, layers="1,2,3")
    store = lens.open_store(out)
    assert store.layers("resid_post") == [0, 1, 2] and store.dtype == str(dtype).replace("torch.", "")
    assert store.manifest["fidelity"]["verdict"] == "ok"
    assert store.manifest["imported"]["from"] == "vllm" and store.manifest["imported"]["layer_ids"] == [1, 2, 3]
    n = [len(tiny_llama.tokenizer(t)["input_ids"]) for t in TEXTS]
    assert store.n_tokens == sum(n) and np.array_equal(np.unique(store.tokens["window"]), [0, 1, 2])
    first = torch.tensor(tiny_llama.tokenizer(TEXTS[0])["input_ids"])
    assert np.array_equal(store.tokens["token_id"][:n[0]], first.numpy())
    assert store.tokens["next_token_id"][n[0] - 1] == -1
    with torch.inference_mode():
        ref = tiny_llama.hf_model(input_ids=first[None], output_hidden_states=True).hidden_states[2][0].to(dtype)
    assert torch.equal(store.get("resid_post", 1)[:n[0]], ref)  # id 2 = the state after block 1
    # a capture of the same text agrees within the float32 tolerance
    texts = [str(t) for t in store.tokens["token"][:n[0]]]
    assert "".join(texts).strip().startswith("The quick")


def test_the_connectors_first_layout_reads_the_same(tiny_llama, tmp_path):
    now = lens.open_store(import_store(write_vllm_files(tiny_llama, tmp_path / "a"), "vllm", tmp_path / "s1",
                                       model=tiny_llama, layers="1,2,3"))
    src = write_vllm_files(tiny_llama, tmp_path / "b", layer_first=True)
    first = lens.open_store(import_store(src, "vllm", tmp_path / "s2", model=tiny_llama, layers="1,2,3"))
    assert first.manifest["fidelity"]["verdict"] == "ok" and first.manifest["imported"]["layer_first_files"] == 3
    for layer in (0, 1, 2):
        assert torch.equal(first.get("resid_post", layer), now.get("resid_post", layer))


def test_a_one_layer_shift_is_refused(tiny_llama, tmp_path, capsys):
    src = write_vllm_files(tiny_llama, tmp_path / "hs", shift=1, dtype=torch.float32)
    with pytest.raises(SilentlyWrong, match=r"resid_post at layer \d differs from Hugging Face"):
        import_store(src, "vllm", tmp_path / "s", model=tiny_llama, layers="1,2,3")
    assert nothing_at(tmp_path / "s")
    rc, _, err = cli(["store", "import", src, "--from", "vllm", "--model", "tiny-llama", "--layers", "1,2,3", "--out",
                      tmp_path / "s", "--quiet"], capsys)
    assert rc == 2 and "do not match tiny-llama" in one_error_line(err) and nothing_at(tmp_path / "s")
    # without the check it is kept, and says so
    out = import_store(src, "vllm", tmp_path / "s", model=tiny_llama, layers="1,2,3", verify=False)
    assert lens.open_store(out).manifest["fidelity"]["verdict"] == "not-checked"


def test_bad_vllm_input_is_one_line(tiny_llama, tmp_path, capsys):
    src = write_vllm_files(tiny_llama, tmp_path / "hs", ids=(1, 2), lock=False)
    argv = ["store", "import", src, "--from", "vllm", "--model", "tiny-llama", "--out", tmp_path / "s", "--quiet"]
    rc, _, err = cli(argv, capsys)
    assert rc == 2 and "needs --layers" in one_error_line(err)
    rc, _, err = cli(argv + ["--layers", "1,2,3"], capsys)
    assert rc == 2 and "holds 2 hidden states per token, --layers names 3" in one_error_line(err)
    rc, _, err = cli(argv + ["--layers", "1,9"], capsys)  # tiny-llama has 4 layers
    assert rc == 2 and "does not exist in a model of 4 layers" in one_error_line(err)
    from safetensors.torch import save_file

    other = tmp_path / "other"
    other.mkdir()
    save_file({"hidden_states": torch.zeros(5, 2, 32, dtype=torch.bfloat16), "token_ids": torch.arange(5)},
              str(other / "req.safetensors"))  # a model of hidden size 32
    rc, _, err = cli(["store", "import", other, "--from", "vllm", "--model", "tiny-llama", "--out", tmp_path / "s",
                      "--layers", "1,2", "--quiet"], capsys)
    assert rc == 2 and "a file of another model: hidden size 32" in one_error_line(err) and nothing_at(tmp_path / "s")
    with pytest.raises(LensInputError, match="needs --model"):
        import_store(src, "vllm", tmp_path / "s", layers="1,2")
    assert nothing_at(tmp_path / "s")
