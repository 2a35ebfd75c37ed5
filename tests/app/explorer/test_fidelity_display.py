"""The explorer shows the fidelity record of the store it describes (the overview's model card)."""

from __future__ import annotations

from pathlib import Path

APP = Path(__file__).resolve().parents[3] / "app" / "explorer"


def test_overview_card_shows_the_store_fidelity(app_env):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP / "views" / "overview.py"), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    at.selectbox(key="overview-model").set_value("tiny-llama").run()
    card = at.dataframe[3].value
    fields = dict(zip(card["field"], card["value"]))
    assert fields["store fidelity"].startswith("ok: within 1e-05 of Hugging Face"), fields["store fidelity"]
    record = "\n".join(c.value for c in at.code)
    assert "resid_post: max rel" in record and "last-layer lens vs logits" in record
