"""A store captured from a model folder serves the studies run on that folder.

A model folder's id is the folder's name (``llama-8b``), while the researcher passes its path (``models/llama-8b``)
to ``lens capture`` and again to ``lens study --store``: the two must be recognised as one model (before, every
study refused the store, and the main job captured a second store per study), and a folder of the same name
elsewhere must not be.
"""

from __future__ import annotations

import shutil

import pytest

import lens
from lens.errors import LensInputError

SMALL = ["--corpus", "lee", "--max-tokens", "192", "--seq-len", "32", "--quiet"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    model = lens.load_model("tiny-llama")
    path = tmp_path_factory.mktemp("models") / "my-llama"
    model.hf_model.save_pretrained(path)
    model.tokenizer.save_pretrained(path)
    return path


def test_study_reads_the_store_of_its_model_folder_by_any_path(folder, tmp_path, monkeypatch):
    from app.commands.cli import main
    from studies.core.registry import get_study
    from studies.core.runner import names_store_model

    store = tmp_path / "store"
    assert main(["capture", str(folder), "--out", str(store), "--sites", "resid_post", *SMALL]) == 0
    s = lens.open_store(store)
    assert s.model_id == "my-llama"
    monkeypatch.chdir(folder.parent)
    for spec in (str(folder), "my-llama", "./my-llama", f"{folder.parent}/../{folder.parent.name}/my-llama"):
        assert names_store_model(s, spec), spec
    assert main(["study", "linearity", "--model", "./my-llama", "--store", str(store), "--out", str(tmp_path / "r"),
                 *SMALL]) == 0
    # the main job's shared store is taken, not a second one captured per study
    from studies.core.config import with_model_settings
    from studies.linearity.study import Config
    from studies.job.main_job import _fitted

    cfg = with_model_settings(Config(model=str(folder), corpus="lee", max_tokens=192, seq_len=32, progress=False))
    assert _fitted(get_study("linearity"), cfg, str(store), tmp_path / "job").store == str(store)


def test_a_folder_of_the_same_name_elsewhere_is_another_model(folder, tmp_path):
    from app.commands.cli import main
    from studies.core.runner import names_store_model, run_study

    store = tmp_path / "store"
    assert main(["capture", str(folder), "--out", str(store), "--sites", "resid_post", *SMALL]) == 0
    other = tmp_path / "elsewhere" / "my-llama"
    shutil.copytree(folder, other)
    s = lens.open_store(store)
    assert not names_store_model(s, str(other))
    assert not names_store_model(s, str(tmp_path / "nowhere" / "my-llama"))
    assert not names_store_model(s, "x" * 5000)  # a name no filesystem takes: no OSError
    from studies.linearity.study import Config

    cfg = Config(model=str(other), corpus="lee", max_tokens=192, seq_len=32, store=str(store), progress=False)
    with pytest.raises(LensInputError, match="was captured from 'my-llama'"):
        run_study("linearity", cfg, tmp_path / "r")
