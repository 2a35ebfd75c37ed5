"""One capture spec: every capture default is CaptureSpec's, wherever a capture is asked for (lens.capture,
collect_*, StudyConfig, the command line); a spec and the keywords capture the same bytes; a study's site is
its parameter; Store.get takes (site, layer) as HookSite does."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
import torch

from lens.capturing.spec import CAPTURE_DEFAULTS, LOAD_DEVICE, CaptureSpec


def _defaults(fn) -> dict:
    return {k: p.default for k, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def test_capture_and_collect_take_every_default_from_the_spec():
    from lens.capturing.capture import capture
    from lens.capturing.collect import collect_positions, collect_stats

    spec = CAPTURE_DEFAULTS.flat()  # every setting by its flat name (the parts' fields), then the capture's own
    got = _defaults(capture)
    # capture is given the model (loaded, or loaded from its name with load_model's defaults): the model's own
    # settings are not its keywords
    for name in set(spec) - {"model", "model_dtype", "attn"}:
        assert got[name] == spec[name], name
    for fn in (collect_stats, collect_positions):
        for name, value in _defaults(fn).items():
            if name in spec and not (fn is collect_positions and name == "positions"):  # its own: the last one
                assert value == spec[name], (fn.__name__, name)


def test_study_config_and_cli_flags_take_their_defaults_from_the_spec():
    from app.commands.cli import build_parser
    from studies.core.config import StudyConfig

    config = StudyConfig()
    for name in ("model", "corpus", "max_tokens", "seq_len", "batch_size", "dtype", "model_dtype", "attn", "sample",
                 "sample_seed"):
        assert getattr(config, name) == getattr(CAPTURE_DEFAULTS, name), name
    assert config.device == LOAD_DEVICE
    parser = build_parser()
    cap = parser.parse_args(["capture", "m", "--out", "x"])
    for name in ("corpus", "max_tokens", "seq_len", "batch_size", "dtype", "model_dtype", "attn", "backend",
                 "shard_tokens", "positions", "layers", "sample", "sample_seed"):
        assert getattr(cap, name) == getattr(CAPTURE_DEFAULTS, name), name
    assert cap.sites.split(",") == list(CAPTURE_DEFAULTS.sites)
    study = parser.parse_args(["study", "linearity", "--out", "x"])
    assert (study.model, study.device, study.max_tokens) == (CAPTURE_DEFAULTS.model, LOAD_DEVICE,
                                                             CAPTURE_DEFAULTS.max_tokens)
    spec = config.capture_spec(["resid_post"], positions="last")
    assert isinstance(spec, CaptureSpec) and spec.positions == "last" and spec.sites == ("resid_post",)
    study = parser.parse_args(["study", "all", "--out", "x", "--sample", "first", "--sample-seed", "2"])
    assert (study.sample, study.sample_seed) == ("first", 2)
    spec = dataclasses.replace(config, sample="first", sample_seed=2).capture_spec(["resid_post"])
    assert (spec.sample, spec.sample_seed) == ("first", 2)


def test_a_spec_and_the_keywords_capture_the_same_store(tiny_llama, tmp_path):
    import lens

    kw = dict(corpus="lee", sites=["resid_post", "embed"], layers="0,2", max_tokens=300, seq_len=32, batch_size=3,
              shard_tokens=100, dtype="float16")
    by_kw = lens.capture(tiny_llama, out=tmp_path / "kw", progress=False, **kw)
    by_spec = lens.capture(tiny_llama, spec=CaptureSpec(model="tiny-llama", **kw), out=tmp_path / "spec",
                           progress=False)
    assert by_kw.manifest["settings"] == by_spec.manifest["settings"]
    assert by_kw.manifest["fingerprint"] == by_spec.manifest["fingerprint"]
    assert len(by_spec.manifest["shards"]) == len(by_kw.manifest["shards"]) > 1
    for layer in (0, 2):
        assert torch.equal(by_kw.get("resid_post", layer), by_spec.get("resid_post", layer))
    assert torch.equal(by_kw.get("embed"), by_spec.get("embed"))
    # the spec's model is loaded when no model is given
    alone = lens.capture(spec=CaptureSpec(model="tiny-llama", **kw), progress=False)
    assert torch.equal(alone.get("resid_post", 2), by_kw.get("resid_post", 2))


def test_settings_are_in_a_spec_or_in_keywords_not_both(tiny_llama):
    import lens

    with pytest.raises(TypeError, match="not both.*max_tokens"):
        lens.capture(tiny_llama, spec=CaptureSpec(max_tokens=100), max_tokens=50)
    with pytest.raises(TypeError, match="needs a model"):
        lens.capture()


def test_store_get_takes_site_then_layer(tiny_llama):
    import lens

    store = lens.capture(tiny_llama, corpus="lee", sites=["resid_post", "resid_mid"], max_tokens=100,
                         progress=False)
    assert torch.equal(store.get("resid_mid", 1), store.get(layer=1, site="resid_mid"))
    assert torch.equal(store.get(layer=1), store.get("resid_post", 1))
    assert not torch.equal(store.get("resid_mid", 1), store.get("resid_post", 1))
    with pytest.raises(TypeError, match=r"\(site, layer\)"):
        store.get(1, "resid_mid")  # the old order is refused, never read as another site
    with pytest.raises(TypeError, match=r"\(site, layer\)"):
        store.get(np.int64(1))


def test_the_site_is_a_parameter_of_every_study_that_reads_one():
    from lens.errors import LensInputError
    from lens.sites import DEFAULT_SITE, Site
    from studies.core.config import SiteConfig, config_from_dict
    from studies.core.registry import STUDIES, get_study

    reading = []
    for name in STUDIES:
        study = get_study(name)
        config = study.config()
        needs = study.needs(config)
        if not needs.reads_store:
            continue
        assert issubclass(study.config, SiteConfig), name
        assert config.site == DEFAULT_SITE and config.site in needs.sites, name
        other = config_from_dict(study.config, {"site": "resid-mid"})
        assert other.site is Site.RESID_MID and Site.RESID_MID in study.needs(other).sites, name
        reading.append(name)
    assert len(reading) >= 8
    with pytest.raises(LensInputError, match="every layer"):
        config_from_dict(get_study("linearity").config, {"site": "embed"})
    with pytest.raises(LensInputError, match="unknown site"):
        config_from_dict(get_study("linearity").config, {"site": "resid_pots"})


def test_a_study_reads_the_site_it_is_given(tiny_llama, tmp_path):
    import lens
    from studies.core.registry import get_study
    from studies.core.runner import run_study
    from studies.reporting.results import read_result

    store = tmp_path / "store"
    lens.capture(tiny_llama, corpus="lee", sites=["resid_post", "resid_mid"], max_tokens=400, out=store,
                 progress=False)
    study = get_study("linearity")
    recs = {}
    for site in ("resid_post", "resid_mid"):
        config = study.config(model="tiny-llama", corpus="lee", store=str(store), progress=False, site=site)
        recs[site] = read_result(run_study(study, config, tmp_path / site))
    assert recs["resid_mid"].extra["site"] == "resid_mid" and recs["resid_mid"].config["site"] == "resid_mid"
    assert recs["resid_post"].extra["site"] == "resid_post"
    assert recs["resid_mid"].metrics["linearity"] != recs["resid_post"].metrics["linearity"]
