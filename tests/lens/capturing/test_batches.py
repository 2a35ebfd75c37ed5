"""lens.capturing.batches: right and left padding and the pad id, the one way every forward pass pads."""

from __future__ import annotations

import numpy as np

from lens.capturing.batches import left_padded, pad_id, padded_tensors, right_padded


class _Tok:
    def __init__(self, pad):
        self.pad_token_id = pad


def test_right_padding_puts_the_real_tokens_first():
    ids, mask = right_padded([[5, 6, 7], [8]], pad=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert ids.dtype == np.int64 and mask.dtype == np.int64
    wide, _ = padded_tensors([np.array([1, 2])], pad=-1, width=4)
    assert wide.tolist() == [[1, 2, -1, -1]]


def test_left_padding_right_aligns_and_numbers_real_tokens_from_zero():
    x, mask, pos = left_padded([[5, 6, 7], [8], []], pad=9)
    assert x.tolist() == [[5, 6, 7], [9, 9, 8], [9, 9, 9]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert pos.tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 0]]


def test_the_pad_id_is_the_tokenizers_else_zero():
    assert pad_id(_Tok(3)) == 3 and pad_id(_Tok(None)) == 0 and pad_id(object()) == 0
