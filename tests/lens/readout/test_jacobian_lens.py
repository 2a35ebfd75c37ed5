"""Jacobian lens (lens.readout.jacobian_lens / jacobian_fit): known answers on a linear chain, an independent full
Jacobian on tiny-llama (and the off-by-one it would catch), J = I and the logit lens at the last layer, parts that
add up, and the files refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import lens
from lens.errors import LensInputError
from lens.readout.jacobian_fit import fit_sums, part_range, prompt_jacobians, settings_for
from lens.readout.jacobian_lens import JacobianSums, load_lens, merge_sums
from lens.readout.logit_lens import logit_lens
from lens.readout.jacobian_lens import jacobian_lens_metrics
from lens.store.parts import Part


class _Chain(nn.Module):
    """Blocks that are linear maps acting on each position alone: J_l is the product of the later blocks' maps."""

    def __init__(self, d=8, n_layers=4, vocab=50):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(n_layers))
        with torch.no_grad():
            for b in self.layers:
                b.weight.copy_(torch.eye(d) + 0.3 * torch.randn(d, d, generator=g) / d ** 0.5)

    def forward(self, input_ids, use_cache=False):
        h = self.embed(input_ids)
        for b in self.layers:
            h = b(h)
        return h


class _Duck:
    """The parts of a LoadedModel the fit uses."""

    def __init__(self, net):
        self.hf_model, self.layers = net, net.layers
        self.n_layers, self.d_model = len(net.layers), net.embed.embedding_dim
        self.device, self.model_id, self.revision = torch.device("cpu"), "chain", ""


def _prompts(n, lengths=(20, 16, 24, 18), seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(5, 45, lengths[i % len(lengths)]) for i in range(n)]


@pytest.fixture(scope="module")
def tiny():
    return lens.load_model("tiny-llama")


def test_linear_chain_gives_the_product_of_the_block_maps():
    net = _Chain()
    m = _Duck(net)
    st = settings_for(m, skip_first=3, max_seq_len=32)
    J = fit_sums(m, _prompts(3), st, dim_batch=3).lens()
    W = [b.weight.detach().double() for b in net.layers]
    for l in range(m.n_layers - 1):
        expect = torch.eye(m.d_model, dtype=torch.float64)
        for k in range(l + 1, m.n_layers):
            expect = W[k] @ expect
        assert torch.allclose(J.matrix(l).double(), expect, atol=1e-5), l
        # the off-by-one (h_l taken as block l's input: the product from block l, not l + 1) is far off
        assert (J.matrix(l).double() - expect @ W[l]).abs().max() > 1e-2
    assert torch.equal(J.matrix(m.n_layers - 1), torch.eye(m.d_model))


def _full_jacobian_lens(model, ids, layer, skip_first):
    """Independent: torch.autograd.functional.jacobian of the last block's output with respect to block
    ``layer``'s output (substituted by a hook), the Jacobian summed over valid target positions and
    averaged over valid source positions — the reference's estimator (its sum over targets taken before the
    Jacobian: a d-output function, d backward passes instead of T·d)."""
    last = model.n_layers - 1
    ids_t = torch.as_tensor(ids)[None]
    got = {}

    def keep(i):
        def hook(mod, inp, out):
            got[i] = out if torch.is_tensor(out) else out[0]
        return hook

    hs = [model.layers[i].register_forward_hook(keep(i)) for i in (layer, last)]
    with torch.no_grad():
        model.hf_model(input_ids=ids_t, use_cache=False)
    for h in hs:
        h.remove()
    h0 = got[layer][0].detach().clone()

    def f(x):
        def swap(mod, inp, out):
            return x[None] if torch.is_tensor(out) else (x[None], *out[1:])
        out = {}
        h1 = model.layers[layer].register_forward_hook(swap)
        h2 = model.layers[last].register_forward_hook(
            lambda mod, inp, o: out.__setitem__("y", o if torch.is_tensor(o) else o[0]))
        try:
            model.hf_model(input_ids=ids_t, use_cache=False)
        finally:
            h1.remove()
            h2.remove()
        return out["y"][0]

    valid = list(range(skip_first, len(ids) - 1))
    # the Jacobian of the sum over valid target positions (linear, so the sum of their Jacobians): (d, T, d)
    full = torch.autograd.functional.jacobian(lambda x: f(x)[valid].sum(0), h0, vectorize=True).double()
    return full[:, valid, :].mean(1)  # (d_out, d_in): averaged over valid source positions


def test_tiny_llama_equals_the_independent_full_jacobian_and_no_neighbour(tiny):
    ids = _prompts(1, lengths=(14,), seed=3)[0]
    st = settings_for(tiny, skip_first=4, max_seq_len=32)
    J, n_valid = prompt_jacobians(tiny, ids, st, dim_batch=16)
    assert n_valid == 14 - 1 - 4
    refs = {l: _full_jacobian_lens(tiny, ids, l, 4) for l in range(tiny.n_layers - 1)}
    for i, l in enumerate(st.layers):
        err = (J[i] - refs[l]).abs().max() / refs[l].abs().max()
        assert err < 1e-4, (l, float(err))  # float32 gradients, two autograd paths
        for other in (l - 1, l + 1):  # an off-by-one layer differs by far more than the float bound
            if other in refs:
                assert (J[i] - refs[other]).abs().max() / refs[l].abs().max() > 0.05


def test_last_layer_is_identity_and_equals_the_logit_lens(tiny):
    prompts = _prompts(2, lengths=(12, 10), seed=1)
    st = settings_for(tiny, skip_first=2, max_seq_len=16)
    jl = fit_sums(tiny, prompts, st, dim_batch=32).lens()
    got = {}
    hs = [tiny.layers[i].register_forward_hook(
        lambda mod, inp, out, i=i: got.__setitem__(i, (out if torch.is_tensor(out) else out[0])[0]))
        for i in range(tiny.n_layers)]
    with torch.no_grad():
        tiny.hf_model(input_ids=torch.as_tensor(prompts[0])[None])
    for h in hs:
        h.remove()
    states = {l: got[l] for l in range(tiny.n_layers)}
    final = states[tiny.n_layers - 1]
    nt = np.r_[prompts[0][1:], -1]
    jr = jacobian_lens_metrics(tiny, jl, states, final, nt)
    lr = logit_lens(tiny, states, final, nt)
    assert np.allclose(jr.ce[-1], lr.ce[-1], atol=1e-6) and jr.kl_to_final[-1] < 1e-6
    # layer 1 decodes as unembed(final_norm(J_1 h_1))
    with torch.no_grad():
        logits = tiny.hf_model.lm_head(tiny.final_norm(states[1] @ jl.matrix(1).T))
        ce = torch.nn.functional.cross_entropy(logits[:-1], torch.as_tensor(nt[:-1]))
    assert abs(float(ce) - jr.ce[1]) < 1e-4


def test_two_parts_merged_equal_the_single_fit(tmp_path):
    m = _Duck(_Chain(d=6, n_layers=3))
    prompts = _prompts(5)
    st = settings_for(m, skip_first=2, max_seq_len=32)
    whole = fit_sums(m, prompts, st, dim_batch=4)
    parts = [fit_sums(m, prompts, st, dim_batch=4, part=Part(i, 2)) for i in (1, 2)]
    for i, p in enumerate(parts):
        p.save(tmp_path / f"p{i}.safetensors")
    merged = merge_sums([JacobianSums.load(tmp_path / f"p{i}.safetensors") for i in range(2)])
    assert merged.n_prompts == whole.n_prompts == 5 and merged.parts == ["1/2", "2/2"]
    # float64 sums of the same per-prompt estimators, added in another order
    assert (merged.sums - whole.sums).abs().max() <= 1e-12 * whole.sums.abs().max()
    merged.save(tmp_path / "m.safetensors")
    assert torch.allclose(load_lens(tmp_path / "m.safetensors").matrices, whole.lens().matrices, atol=1e-6)
    with pytest.raises(LensInputError, match="missing"):
        load_lens(tmp_path / "p0.safetensors")
    with pytest.raises(LensInputError, match="given twice"):
        merge_sums([parts[0], parts[0]])
    other = fit_sums(m, prompts, settings_for(m, skip_first=3, max_seq_len=32), dim_batch=4, part=Part(2, 2))
    with pytest.raises(LensInputError, match="other settings.*skip_first=2 vs 3"):
        merge_sums([parts[0], other])
    assert part_range(5, Part(1, 2)) == (0, 2) and part_range(5, Part(2, 2)) == (2, 5)


def test_bad_files_are_refused(tmp_path, tiny):
    m = _Duck(_Chain(d=6, n_layers=3))
    sums = fit_sums(m, _prompts(2), settings_for(m, skip_first=2, max_seq_len=32), dim_batch=6)
    path = sums.save(tmp_path / "chain.safetensors")
    with pytest.raises(LensInputError, match="fitted on chain, not tiny-llama"):
        load_lens(path).check_model(tiny)
    data = path.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(LensInputError, match="truncated"):
        load_lens(tmp_path / "cut.safetensors")
    import pickle

    (tmp_path / "bare.pkl").write_bytes(pickle.dumps({"J": {0: [1.0]}}, protocol=2))
    with pytest.raises(LensInputError, match="pickled"):
        load_lens(tmp_path / "bare.pkl")
    # a torch.save archive that names any callable but a tensor's rebuild is refused before anything runs
    torch.save({"J": {0: nn.Linear(2, 2)}}, tmp_path / "module.pt")
    with pytest.raises(LensInputError, match="torch.nn.modules.linear.Linear.*never unpickled"):
        load_lens(tmp_path / "module.pt")
    pt = (tmp_path / "module.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(pt[: len(pt) // 2])
    with pytest.raises(LensInputError, match="truncated"):
        load_lens(tmp_path / "cut.pt")


def test_published_layout_loads_and_is_checked_against_the_model(tmp_path, tiny):
    from safetensors.torch import save_file

    d, L = tiny.d_model, tiny.n_layers
    save_file({str(l): torch.eye(d, dtype=torch.float16) for l in range(L - 1)}, str(tmp_path / "pub.safetensors"))
    jl = load_lens(tmp_path / "pub.safetensors", tiny)
    assert jl.settings.model_id == "tiny-llama" and jl.layers == list(range(L - 1))
    # the reference's own file (jlens.lens.JacobianLens.save: torch.save of fp16 matrices), parsed without unpickling
    J = {l: (torch.eye(d) + 0.01 * torch.randn(d, d)).half() for l in range(L - 1)}
    torch.save({"J": J, "n_prompts": 7, "source_layers": list(range(L - 1)), "d_model": d}, tmp_path / "lens.pt")
    ref = load_lens(tmp_path / "lens.pt", tiny)
    assert ref.n_prompts == 7 and all(torch.equal(ref.matrix(l), J[l].float()) for l in range(L - 1))
    save_file({f"J.{l}": torch.eye(d + 1) for l in range(L - 1)}, str(tmp_path / "wide.safetensors"))
    with pytest.raises(LensInputError, match="width 65"):
        load_lens(tmp_path / "wide.safetensors", tiny)
