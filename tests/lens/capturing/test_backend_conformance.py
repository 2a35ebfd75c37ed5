"""One conformance suite for the capture backends (lens.capturing.backends.protocol.CaptureBackend): native hooks,
TransformerLens' bridge, nnsight and the unpadded path (EqualLengths) each pass it by subclassing
:class:`BackendConformance` and saying how to build themselves, as zarr's store tests do. A new backend is one
more subclass.

What every backend must do, on a tiny random Llama: be a ``CaptureBackend`` (name, model, the hooks as a tuple of
``HookSite``), return a ``(batch, seq, width)`` tensor for every hook's key and nothing else, read at the real
positions of a right-padded batch what Hugging Face's ``output_hidden_states`` holds (1e-5 in float32), and give
the model's logits when asked."""

from __future__ import annotations

import pytest
import torch

from lens.capturing.backends import BACKENDS, make_backend
from lens.capturing.backends.native import NativeBackend
from lens.capturing.backends.protocol import CaptureBackend
from lens.capturing.unpadded import EqualLengths
from lens.sites import HookSite, Site

ATOL = 1e-5
LENGTHS = (12, 7, 12, 3)  # a right-padded batch: rows of several real lengths


def hooks_for(model) -> tuple[HookSite, ...]:
    return (HookSite(Site.EMBED), *(HookSite(Site.RESID_POST, l) for l in range(model.n_layers)),
            HookSite(Site.ATTN_OUT, 1), HookSite(Site.MLP_OUT, 0))


def padded_batch(model, lengths=LENGTHS, seed=0):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(3, model.d_vocab, (len(lengths), width), generator=g)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        ids[i, n:] = 0
    return ids, mask


class BackendConformance:
    """The suite; a subclass sets :meth:`make` (and ``expected_name``)."""

    expected_name: str = ""

    def make(self, model, hooks) -> CaptureBackend:
        raise NotImplementedError

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls, tiny_llama):
        return cls().make(tiny_llama, hooks_for(tiny_llama))

    def test_is_a_capture_backend(self, backend, tiny_llama):
        assert isinstance(backend, CaptureBackend)
        assert backend.name == self.expected_name and backend.name in BACKENDS
        assert backend.model is tiny_llama
        assert isinstance(backend.hooks, tuple) and backend.hooks == hooks_for(tiny_llama)

    def test_every_hook_and_only_those_as_batch_seq_width(self, backend, tiny_llama):
        ids, mask = padded_batch(tiny_llama)
        states, _ = backend.run(ids, mask)
        assert set(states) == {h.key for h in hooks_for(tiny_llama)}
        for key, x in states.items():
            assert isinstance(x, torch.Tensor) and tuple(x.shape) == (*ids.shape, tiny_llama.d_model), key

    def test_real_positions_equal_hugging_face_hidden_states(self, backend, tiny_llama):
        ids, mask = padded_batch(tiny_llama)
        states, _ = backend.run(ids, mask)
        with torch.inference_mode():
            hs = tiny_llama.hf_model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        real = mask.bool()
        torch.testing.assert_close(states["embed"][real], hs[0][real], atol=ATOL, rtol=0)
        for l in range(tiny_llama.n_layers - 1):  # HF's last hidden state is after the final norm
            torch.testing.assert_close(states[f"resid_post.{l}"][real], hs[l + 1][real], atol=ATOL, rtol=0)

    def test_logits_when_asked(self, backend, tiny_llama):
        ids, mask = padded_batch(tiny_llama)
        _, logits = backend.run(ids, mask, return_logits=True)
        with torch.inference_mode():
            want = tiny_llama.hf_model(input_ids=ids, attention_mask=mask).logits
        real = mask.bool()
        assert logits is not None and tuple(logits.shape) == (*ids.shape, tiny_llama.d_vocab)
        torch.testing.assert_close(logits[real], want[real], atol=1e-4, rtol=0)


class TestNative(BackendConformance):
    expected_name = "native"

    def make(self, model, hooks):
        backend = make_backend("native", model, hooks)
        assert isinstance(backend, NativeBackend)  # tiny-llama is padding-invariant: no wrapper
        return backend


class TestUnpadded(BackendConformance):
    """The path a family that is not padding-invariant takes (lens.capturing.unpadded), around native hooks."""

    expected_name = "native"

    def make(self, model, hooks):
        return EqualLengths(NativeBackend(model, hooks))


class TestTransformerLens(BackendConformance):
    expected_name = "transformer-lens"

    def make(self, model, hooks):
        pytest.importorskip("transformer_lens")
        return make_backend("transformer-lens", model, hooks)


class TestNNsight(BackendConformance):
    expected_name = "nnsight"

    def make(self, model, hooks):
        pytest.importorskip("nnsight")
        return make_backend("nnsight", model, hooks)


def test_the_suite_catches_a_backend_that_breaks_the_contract(tiny_llama):
    """A planted backend that returns a list for hooks, drops a site and reads a neighbour fails the suite."""

    class Neighbour(NativeBackend):
        def __init__(self, model, hooks):
            super().__init__(model, hooks)
            self.hooks = list(self.hooks)

        def run(self, input_ids, attention_mask, return_logits=False):
            states, logits = super().run(input_ids, attention_mask, return_logits)
            states.pop("mlp_out.0")
            states["resid_post.0"] = states["resid_post.1"]
            return states, logits

    class Suite(BackendConformance):
        expected_name = "native"

    suite, bad = Suite(), Neighbour(tiny_llama, hooks_for(tiny_llama))
    for check in (suite.test_is_a_capture_backend, suite.test_every_hook_and_only_those_as_batch_seq_width,
                  suite.test_real_positions_equal_hugging_face_hidden_states):
        with pytest.raises(AssertionError):
            check(bad, tiny_llama)
