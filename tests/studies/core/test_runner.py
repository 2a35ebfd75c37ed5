"""The runner and the main job read the model card and the studies' declarations: the fresh norm,
sites a family lacks, results that break their declaration, stores that do not fit."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from lens.model.card import BlockKind, ModelCard, NormKind
from lens.errors import LensInputError

CARD = ModelCard(model_id="m", model_type="llama", block=BlockKind.SEQUENTIAL, norm_kind=NormKind.RMS, is_causal=True,
                 has_lm_head=True, n_layers=4, d_model=64, d_vocab=100,
                 sites=("embed", "resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "final_norm"))


def test_norm_auto_is_the_cards_final_norm_with_a_stated_fallback():
    from studies.core.config import resolve_norm

    assert resolve_norm("auto", CARD)[0] == "rms"
    assert resolve_norm("auto", dataclasses.replace(CARD, norm_kind=NormKind.LAYER))[0] == "layer"
    encoder = dataclasses.replace(CARD, block=BlockKind.POST_NORM, norm_kind=None, model_id="enc")
    kind, how = resolve_norm("auto", encoder)
    assert kind == "layer" and "fallback" in how and "enc has no final norm" in how
    assert resolve_norm("none", CARD) == (None, "none: configured") and resolve_norm("rms", encoder)[0] == "rms"
    with pytest.raises(LensInputError, match="norm: expected one of auto, rms, layer, none, got 'gelu'"):
        resolve_norm("gelu", CARD)


def test_required_sites_must_exist_optional_ones_are_skipped():
    from studies.core.contract import Needs
    from studies.core.runner import sites_for

    parallel = dataclasses.replace(CARD, block=BlockKind.PARALLEL, sites=("embed", "resid_pre", "resid_post"),
                                   absent={"resid_mid": "parallel attention + MLP: no state between them"})
    assert sites_for(Needs(sites=("resid_post",), optional_sites=("resid_mid",)), CARD) == ("resid_post", "resid_mid")
    assert sites_for(Needs(sites=("resid_post",), optional_sites=("resid_mid",)), parallel) == ("resid_post",)
    with pytest.raises(LensInputError, match="'resid_mid' does not exist .* parallel attention"):
        sites_for(Needs(sites=("resid_mid",)), parallel)


def test_logit_lens_on_a_parallel_family_says_why_resid_mid_is_missing(tmp_path):
    """GPT-NeoX runs attention and MLP in parallel: its card has no resid_mid, so the logit lens
    decodes resid_post only, captures nothing else, and the result says why."""
    from studies.logit_lens.study import M, S
    from studies.core.registry import get_study
    from studies.reporting.results import read_result
    from studies.core.runner import cached_model, run_study

    card = cached_model("tiny:gpt_neox").card()
    assert not card.has_site("resid_mid")
    study = get_study("logit-lens")
    config = study.config(model="tiny:gpt_neox", corpus="lee", max_tokens=200, seq_len=64, progress=False,
                          store=str(tmp_path / "store"), topk_tokens=8)
    rec = read_result(run_study(study, config, tmp_path / "ll"))
    assert rec.summary[S.resid_mid] == f"absent in this family: {card.absent['resid_mid']}"
    assert M.mid_ce not in rec.metrics and len(rec.metrics[M.ce]) == card.n_layers
    assert json.loads((tmp_path / "store" / "manifest.json").read_text())["sites"].keys() == {"resid_post"}


def test_context_memory_on_an_encoder_without_final_norm_states_the_fallback(tmp_path):
    from studies.context_memory.study import S
    from studies.core.registry import get_study
    from studies.reporting.results import read_result
    from studies.core.runner import run_study

    study = get_study("context-memory")
    config = study.config(model="tiny-bert", corpus="wiki-sample", max_tokens=400, progress=False, k=1,
                          nonlinearity=False)
    rec = read_result(run_study(study, config, tmp_path / "cm"))
    assert rec.summary[S.norm] == "layer" and "fallback" in rec.summary[S.norm_source]


def test_a_result_that_breaks_its_declaration_is_refused(tmp_path):
    from studies.core.contract import Names, ResultSpec, StudyResult, array, metric

    spec = ResultSpec(metrics=Names(metric("a", "a metric"), metric("b__{}", "a family")),
                      arrays=Names(array("per_token", "layer token", "x"), array("rows", "token", "rows")),
                      token_rows="rows")
    ok = StudyResult(model="m", corpus="c", n_tokens=3, layers=[0, 1], metrics={"a": [1, 2], "b__x": [0, 0]},
                     arrays={"per_token": np.zeros((2, 3)), "rows": np.arange(3)})
    assert spec.problems(ok) == []
    bad = dataclasses.replace(ok, metrics={"a": [1], "c": [1, 2]}, arrays={"per_token": np.zeros((3, 4)),
                                                                          "rows": np.arange(3)})
    assert spec.problems(bad) == ["metric 'c' is not declared", "metric 'a' has 1 values for 2 layers",
                                  "array 'per_token': axis 'layer' has 3 entries for 2 layers",
                                  "array 'per_token': axis 'token' has 4 entries, 'rows' 3"]


def test_the_main_job_gives_a_study_its_own_store_when_a_reused_one_lacks_a_site(tmp_path):
    import lens
    from app.commands.cli import main

    lens.capture("tiny-llama", corpus="wiki-sample", sites=["resid_post"], max_tokens=300, out=tmp_path / "given",
                 progress=False)
    rc = main(["study", "all", "--model", "tiny-llama", "--max-tokens", "300", "--store", str(tmp_path / "given"),
               "--only", "linearity,context-memory", "--out", str(tmp_path / "run"), "--quiet"])
    assert rc == 0
    config = {s: json.loads((tmp_path / "run" / s / "result.json").read_text())["config"]["store"]
              for s in ("linearity", "context-memory")}
    assert config == {"linearity": str(tmp_path / "given"), "context-memory": str(tmp_path / "run" / "context-memory" / "store")}
    own = lens.open_store(tmp_path / "run" / "context-memory" / "store")
    assert set(own.sites) == {"embed", "resid_post"}


def test_what_the_runner_prepares_is_what_the_contract_types_say(tmp_path):
    """The card, model and stores a study is handed have every member the contract's Protocols name."""
    from studies.core.contract import StudyCard, StudyModel, StudyStore
    from studies.core.registry import get_study
    from studies.core.runner import prepare

    study = get_study("intrinsic-dim")  # a study with a control store
    config = study.config(model="tiny-llama", corpus="lee", max_tokens=200, seq_len=64, progress=False,
                          store=str(tmp_path / "store"))
    inputs = prepare(study, config)
    assert isinstance(inputs.card, StudyCard) and isinstance(inputs.store, StudyStore)
    assert inputs.controls and all(isinstance(s, StudyStore) for s in inputs.controls.values())
    from studies.core.runner import config_model

    assert isinstance(config_model(config), StudyModel) and isinstance(config_model(config).card(), StudyCard)
    assert not isinstance(inputs.card, StudyStore) and not isinstance(inputs.store, StudyModel)
