"""The settings in three frozen parts (lens.capturing.settings, issue #41): resolving gives a plan of another type,
"auto" resolves in ModelSettings.resolve and the study runner goes through it; a bad attention, dtype or device is
one line; the parts are frozen; CaptureSpec and StudyConfig take their defaults and help from the parts and give the
parts back; every field with a flag has one, generated from its metadata, with its help and default."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from lens.capturing.settings import (PARTS, LOAD_DEVICE, ModelPlan, ModelSettings, StorePlan, StoreSettings,
                                     TextPlan, TextSettings, flag_name, part_field)
from lens.capturing.spec import CAPTURE_DEFAULTS, CaptureSpec
from lens.errors import LensInputError
from lens.sites import Site


def test_auto_resolves_to_float32_on_a_cpu_in_the_model_plan():
    plan = ModelSettings(name="tiny-llama").resolve()
    assert isinstance(plan, ModelPlan) and not isinstance(plan, ModelSettings)
    assert (plan.name, plan.dtype, plan.attn, plan.device) == ("tiny-llama", "float32", "eager", LOAD_DEVICE)
    assert ModelSettings(dtype="bf16").resolve().dtype == "bfloat16"  # an alias: the canonical name
    assert ModelSettings(dtype=None).resolve().dtype == "float32"


def test_the_study_config_and_the_runner_resolve_through_the_model_settings(monkeypatch):
    """One place: with_model_settings and cached_model both ask ModelSettings.resolve (seen by replacing it)."""
    from studies.core import runner
    from studies.core.config import StudyConfig, with_model_settings

    asked = []

    def fake(self):
        asked.append(self)
        return ModelPlan(self.name, "float16", self.attn, "cpu")

    monkeypatch.setattr(ModelSettings, "resolve", fake)
    assert with_model_settings(StudyConfig(model="m")).model_dtype == "float16"
    monkeypatch.setattr(runner, "_load_once", lambda *a: a)
    assert runner.cached_model("m", "cpu", "auto", "eager") == ("m", "cpu", "float16", "eager")
    assert [s.name for s in asked] == ["m", "m"]


@pytest.mark.parametrize("settings,says", [
    (ModelSettings(attn="flash"), "attention implementation: expected one of eager, sdpa, got 'flash'"),
    (ModelSettings(dtype="int8"), "unknown model dtype 'int8'"),
    (ModelSettings(device="gpu"), "unknown device 'gpu'"),
    (TextSettings(sample="middle"), "sample must be spread or first"),
    (TextSettings(seq_len=0), "seq_len must be an integer >= 1"),
    (StoreSettings(dtype="int8"), "unknown store dtype 'int8'"),
    (StoreSettings(shard_tokens=-1), "shard_tokens must be an integer >= 1"),
])
def test_a_bad_setting_is_one_line_when_resolved(settings, says):
    with pytest.raises(LensInputError) as info:
        settings.resolve()
    assert says in str(info.value) and "\n" not in str(info.value)


def test_text_and_store_plans_are_checked_values_of_another_type():
    text = TextSettings(corpus="lee", sample="FIRST", transform="truncate:16").resolve()
    assert isinstance(text, TextPlan) and text.sample == "first"
    assert text.transform.kind == "truncate" and text.transform.n == 16
    store = StoreSettings(sites="resid_mid,attn_out", positions="0,5,-1", dtype="bf16").resolve()
    assert isinstance(store, StorePlan)
    assert store.sites == (Site.RESID_MID, Site.ATTN_OUT) and store.positions == (0, 5, -1)
    assert store.dtype == "bfloat16"


def test_the_parts_are_frozen():
    for part in PARTS:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part(), dataclasses.fields(part)[0].name, "x")


def test_the_spec_and_the_study_config_take_their_defaults_from_the_parts_and_give_them_back():
    from studies.core.config import StudyConfig

    spec, config = CAPTURE_DEFAULTS, StudyConfig()
    assert spec.text == TextSettings() and spec.store_settings == StoreSettings()
    assert spec.model_settings == ModelSettings(device=None)  # the spec's device None: where the model is
    assert config.model_settings == ModelSettings() and config.text == TextSettings()
    # the parts are the holders' fields: no setting of a part is a field of its own (said once, in the part); the
    # one flat field left (StudyConfig's stored dtype) has the part's default and help
    for holder in (CaptureSpec, StudyConfig):
        names = {f.name for f in dataclasses.fields(holder)}
        assert {"model_settings", "text"} <= names and not names & set(holder.FLAT), holder.__name__
        for f in dataclasses.fields(holder):
            if "help" in f.metadata:
                owners = [p for p in PARTS if f.metadata in [g.metadata for g in dataclasses.fields(p)]]
                assert len(owners) == 1, (holder.__name__, f.name)
    # built from parts: the same spec as the keywords
    built = CaptureSpec.of(ModelSettings(name="tiny-llama", dtype="float32"), TextSettings(max_tokens=64, seq_len=16),
                           StoreSettings(sites=["resid_mid"], positions="last"), backend="native")
    assert built == CaptureSpec(model="tiny-llama", model_dtype="float32", max_tokens=64, seq_len=16,
                                sites=("resid_mid",), positions="last", device=LOAD_DEVICE)
    changed = dataclasses.replace(config, model_dtype="float16", max_tokens=10)  # the flat names keep working
    assert changed.model_settings.dtype == "float16" and changed.text.max_tokens == 10
    assert changed.capture_spec(["resid_post"]).text == changed.text


def _flags(parser: argparse.ArgumentParser) -> dict:
    return {opt: a for a in parser._actions for opt in a.option_strings}


def _sub(parser, *names):
    for name in names:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return parser


def test_every_setting_has_its_generated_flag_with_its_help_and_default():
    """Each field with a flag: in `lens capture` (the model's name is capture's positional) or `lens study`, with
    the field's help (or a command's narrower one), choices and default."""
    from app.commands.cli import build_parser

    parser = build_parser()
    commands = {"capture": _flags(_sub(parser, "capture")), "study": _flags(_sub(parser, "study"))}
    for part in PARTS:
        for f in dataclasses.fields(part):
            flag = flag_name(f)
            assert f.metadata["help"], (part.__name__, f.name)
            assert flag is not None, f"{part.__name__}.{f.name} has no flag"
            actions = [c[flag] for c in commands.values() if flag in c]
            assert actions, f"{flag} ({part.__name__}.{f.name}) is in no command"
            for action in actions:
                default = ",".join(f.default) if f.metadata["kind"] == "list" else f.default
                assert action.help == f.metadata["help"], flag
                assert action.default == default or (flag == "--device" and action.default is None), flag
                assert tuple(action.choices or ()) == tuple(f.metadata["choices"] or ()), flag
    # a flag's value parses to the field's type, and the parts read back from the parsed arguments
    from app.commands.flags import settings_from_args

    args = parser.parse_args(["study", "linearity", "--out", "x", "--max-tokens", "64", "--model-dtype", "float16"])
    assert settings_from_args(TextSettings, args) == TextSettings(max_tokens=64)
    assert settings_from_args(ModelSettings, args) == ModelSettings(dtype="float16")
    args = parser.parse_args(["capture", "m", "--out", "x", "--sites", "resid_mid,attn_out", "--transform", "shuffle"])
    assert settings_from_args(StoreSettings, args).sites == (Site.RESID_MID, Site.ATTN_OUT)
    assert settings_from_args(TextSettings, args).transform == "shuffle"


def test_the_choices_are_the_loaders_and_the_stores():
    # the model's choices are lens.model.default's MODEL_DTYPES / ATTN_IMPLEMENTATIONS, which the loader checks
    from lens.store.schema import DTYPES
    from lens.text.windows import SAMPLES

    assert part_field(TextSettings, "sample").metadata["choices"] == tuple(SAMPLES)
    from lens.capturing.settings import STORE_DTYPE_CHOICES

    assert set(STORE_DTYPE_CHOICES) == set(DTYPES)


def test_the_commands_load_the_model_their_flags_name_through_its_plan(monkeypatch):
    """lens capture / stats / inspect / jlens fit load through ModelSettings.resolve: "auto" arrives concrete."""
    import lens
    from app.commands.cli import build_parser
    from app.commands.flags import load_model_from_args

    seen = {}
    monkeypatch.setattr(lens, "load_model", lambda name, **kw: seen.update(name=name, **kw) or "model", raising=False)
    args = build_parser().parse_args(["stats", "tiny-llama", "--out", "x", "--attn", "sdpa"])
    assert load_model_from_args(args, args.device, offload_folder=None) == "model"
    assert seen == {"name": "tiny-llama", "device": "cpu", "dtype": "float32", "attn_implementation": "sdpa",
                    "offload_folder": None}
