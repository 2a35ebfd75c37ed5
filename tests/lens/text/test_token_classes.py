"""Token classes: sub-word markers stripped, fixed class vocabulary."""

import pytest

from lens.text.token_classes import TOKEN_CLASSES, token_class, token_classes


@pytest.mark.parametrize(
    "token, cls",
    [
        ("Ġthe", "determiner"), ("▁The", "determiner"), ("a", "determiner"),
        ("Ġof", "stopword"), ("▁and", "stopword"), ("n't", "stopword"), ("'s", "stopword"),
        (",", "punctuation"), ("Ġ(", "punctuation"), ("...", "punctuation"), ("$", "punctuation"),
        ("Ġ1999", "number"), ("3.14", "number"),
        ("ĠParis", "content"), ("##ing", "content"), ("▁running", "content"),
        ("<s>", "other"), ("[CLS]", "other"), ("<|endoftext|>", "other"), ("Ċ", "other"), ("", "other"),
    ],
)  # fmt: skip
def test_token_class(token, cls):
    assert token_class(token) == cls
    assert cls in TOKEN_CLASSES


def test_vectorised_and_errors():
    assert token_classes(["Ġthe", "Ġcat"]).tolist() == ["determiner", "content"]
    with pytest.raises(ValueError, match="token must be a str; got int"):
        token_class(3)
