"""Run a study: prepare → compute → write (see :mod:`studies.core.contract`).

Prepare loads the model (once per process), reads its typed card, refuses what the study cannot use
before anything is captured (no LM head, not causal, a site this family does not have), then opens
``config.store`` — which must come from the same model and hold every site and layer the study
reads — or captures it. Write puts the result, its figures and its files in a results folder.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from pathlib import Path
from types import SimpleNamespace
import shutil

import lens
from lens.errors import LensInputError, ModelLacks
from lens.sites import Site
from lens.store.layout import is_store
from studies.core.config import with_model_settings
from studies.core.contract import Inputs, Needs, Study, StudyResult
from studies.core.precision import declared_precision, reached
from lens.capturing.settings import ModelSettings
from lens.store.fidelity import verdict_line, worst_record
from lens.store.format import sample_label, store_sample
from lens.text.transforms import parse_transform
from studies.core.registry import get_study  # imports no study (nor runner) at its own import
from studies.reporting.results import RESULT_FILE, _clean, require_results_folder, write_result

log = logging.getLogger(__name__)


def cached_model(spec: str, device: str = "cpu", model_dtype: str | None = None,
                 attn: str = "eager") -> lens.LoadedModel:
    """Load once per process (the main job runs many studies on one model); ``model_dtype`` and
    ``attn``: :func:`lens.load_model`'s ``dtype`` (None = float32) and ``attn_implementation``."""
    plan = ModelSettings(name=spec, dtype=model_dtype, attn=attn, device=device).resolve()
    return _load_once(spec, plan.device, plan.dtype, plan.attn)


@functools.lru_cache(maxsize=2)
def _load_once(spec: str, device: str, model_dtype: str, attn: str) -> lens.LoadedModel:
    return lens.load_model(spec, device=device, dtype=model_dtype, attn_implementation=attn)


def config_model(config) -> lens.LoadedModel:
    """:func:`cached_model` of ``config``'s model, device, model dtype and attention."""
    return cached_model(config.model, config.device, config.model_dtype, config.attn)


def store_model_settings(store: lens.Store) -> tuple[str, str]:
    """(model dtype, attention) the store's model ran in; a store from before its settings named them
    ran in its card's dtype with eager attention."""
    settings = store.manifest.get("settings") or {}
    return (str(settings.get("model_dtype") or store.card.dtype or "float32"), str(settings.get("attn") or "eager"))


def store_exists(path) -> bool:
    return is_store(path)


def sites_for(needs: Needs, card) -> tuple[Site, ...]:
    """The sites a study reads from this model: every required one (a clear error where the family
    has none) and the optional ones the family has."""
    for s in needs.sites:
        card.require_site(s)
    return tuple(dict.fromkeys([*needs.sites, *(s for s in needs.optional_sites if card.has_site(s))]))


def names_store_model(store: lens.Store, spec: str) -> bool:
    """Whether the model spec ``spec`` (alias, hub id, folder or file) names the model ``store`` was captured
    from: its model id, or a path to the folder or file it was loaded from (a model folder's id is the
    folder's name, and the researcher passes the path, as they did to capture it)."""
    if str(spec) == store.model_id:
        return True
    source = store.card.source  # the path it was loaded from (as given then), or a word saying where from
    try:
        path = Path(spec).expanduser()
        return bool(source) and path.exists() and path.resolve() == Path(source).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):  # a name no filesystem takes: not a path to that model
        return False


def store_problem(store: lens.Store, model_id: str, sites, model_dtype: str | None = None,
                  attn: str | None = None, who: str = "this study", sample: tuple[str, int] | None = None
                  ) -> str | None:
    """Why ``store`` cannot serve ``who`` (a study) reading ``sites`` of ``model_id`` (every layer) run in
    ``model_dtype`` with ``attn`` attention (None: either), or None. ``sample``: (sample, seed) the store's
    tokens must have been drawn with (None: any; a store the user names is read as it is, and its results
    record its sample)."""
    if not names_store_model(store, model_id):
        return f"store {store.root} was captured from {store.model_id!r}, but {who} runs {model_id!r}"
    if sample is not None:

        want = (sample[0], None if sample[0] == "first" else int(sample[1]))
        if store_sample(store.manifest) != want:
            asked = sample[0] if want[1] is None else f"{sample[0]} (seed {want[1]})"
            return (f"store {store.root} holds the {sample_label(store.manifest)} sample of its corpus, but {who} "
                    f"draws the {asked} sample (--sample, --sample-seed)")
    have_dtype, have_attn = store_model_settings(store)
    if model_dtype is not None and have_dtype != model_dtype:
        return (f"store {store.root} was captured with the model in {have_dtype}, but {who} runs it in "
                f"{model_dtype} (--model-dtype)")
    if attn is not None and have_attn != attn:
        return f"store {store.root} was captured with {have_attn} attention, but {who} runs {attn} (--attn)"
    n_layers = store.card.n_layers
    for s in sites:
        site = Site.parse(s)
        if not store.has(site):
            return f"store {store.root} lacks site {site.value!r} (has {', '.join(store.sites)})"
        if site.per_layer:
            missing = [l for l in range(n_layers) if not store.has(site, l)]
            if missing:
                return f"store {store.root} lacks layers {missing} of {site.value} (has {store.layers(site)})"
    return None


def positions_problem(study: Study, store: lens.Store) -> str | None:
    """Why ``study`` cannot read ``store``, a store that keeps only some positions of each window, or None."""
    kept = store.manifest.get("positions", "all")
    if kept == "all" or not study.needs_all_positions:
        return None
    where = f"store {store.root}" if store.root is not None else "the store"
    return (f"{study.name} needs every position of each window ({study.needs_all_positions}), but {where} keeps "
            f"positions {kept!r} only: capture a store with --positions all for it (or pass another --store)")


def _open_or_capture(config, model, sites, path, transform=None, positions="all") -> lens.Store:
    if store_exists(path):
        store = lens.open_store(path)
        problem = store_problem(store, config.model, sites, config.model_dtype, config.attn)
        if problem:
            raise LensInputError(problem)
    else:
        store = lens.capture(model, spec=config.capture_spec(sites, transform=transform, positions=positions),
                             out=path, progress=config.progress)
    store.require_usable(sites)  # incomplete, or NaN/inf at a layer it reads: exit 2 naming it
    return store


def check_model(needs: Needs, card) -> None:
    """Refuse, before any capture, a model the study cannot use."""
    if needs.causal and not card.is_causal:
        raise ModelLacks(f"{card.model_id} is not a causal language model ({card.model_type}, "
                         f"{card.block.value} blocks): expected a decoder")
    if needs.lm_head:
        card.require_lm_head()


def control_config(config, needs: Needs):
    """``config`` with the token budget a control store is captured with: the study's own, capped at
    ``needs.control_tokens`` when it names one."""
    cap = needs.control_tokens
    if not cap or (config.max_tokens is not None and config.max_tokens <= cap):
        return config
    return config.with_settings(max_tokens=cap)


def prepare(study: Study, config) -> Inputs:
    """Load, check and capture (or open) what ``study.needs(config)`` asks for."""
    if study.check is not None:
        study.check(config)
    needs = study.needs(config)
    store = lens.open_store(config.store) if (needs.reads_store or needs.tokens) and store_exists(config.store) else None
    problem = positions_problem(study, store) if store is not None else None
    if problem:  # before anything else is asked of the store: no other answer helps
        raise LensInputError(problem)
    # the model: when asked for, to capture a store that is not there yet, or for its card
    model = config_model(config) if needs.model or store is None else None
    card = model.card() if model is not None else store.card  # type: ignore[union-attr]  # no model: a store was found
    check_model(needs, card)
    sites = sites_for(needs, card)
    if store is not None:
        problem = store_problem(store, config.model, sites, config.model_dtype, config.attn)
        if problem:
            raise LensInputError(problem)
        if needs.reads_store:
            store.require_usable(sites)
    elif needs.reads_store:
        store = _open_or_capture(config, model, sites, config.store)
    controls = {}
    for name, transform in needs.controls:

        path = None if config.store is None else f"{str(config.store).rstrip('/')}-{name}"
        if not store_exists(path) and model is None:
            model = config_model(config)
        # a control keeps the positions its store keeps: the two are compared row set for row set
        kept = store.manifest.get("positions", "all") if store is not None else "all"
        controls[name] = _open_or_capture(control_config(config, needs), model, sites, path,
                                          transform=parse_transform(transform), positions=kept)
        if controls[name].manifest.get("positions", "all") != kept:
            raise LensInputError(f"control store {path} keeps positions {controls[name].manifest.get('positions', 'all')!r}"
                                 f", but {config.store} keeps {kept!r}: delete {path} to capture it again")
    corpus = store.manifest.get("corpus", {}).get("name", config.corpus) if store is not None else config.corpus
    return Inputs(card=card, model=model, store=store, controls=controls, sites=sites, corpus=corpus)


def store_fidelity(inputs: Inputs) -> dict:
    """What a result records of the fidelity of the stores it read (its store and its controls): the worst
    record's verdict (``not recorded`` for stores from before records), whether it was kept with
    --allow-silently-wrong, and its line (lens.store.fidelity). A silently wrong one marks every verdict of the
    result (studies.reporting.headlines)."""
    stores = [inputs.store, *inputs.controls.values()]
    worst = worst_record([s.manifest for s in stores if s is not None])
    return {"verdict": worst.verdict if worst is not None else "not recorded",
            "accepted": bool(worst is not None and worst.accepted), "line": verdict_line(worst)}


def registered(name: str) -> Study:
    """The registered study ``name`` (the registry, which imports no study at its own import, finds it)."""
    return get_study(name)


def run_study(study: "Study | str", config, out_dir) -> Path:
    """Prepare, compute, write; returns the results folder."""
    if isinstance(study, str):
        study = registered(study)

    require_results_folder(out_dir, config.store)  # a store folder or a file where the folder goes: refused before the work, not after
    t0 = time.time()
    try:
        config = with_model_settings(config)  # the result records the model dtype that ran, not "auto"
        inputs = prepare(study, config)
        result = study.compute(config, inputs)
    except LensInputError as exc:  # every refusal names the study it comes from (and keeps its kind)
        text = str(exc)
        raise type(exc)(text if text.startswith(f"{study.name}:") else f"{study.name}: {text}") from None
    if inputs.store is not None:

        kept = inputs.store.manifest.get("positions", "all")
        extra = {**result.extra, "store_sample": sample_label(inputs.store.manifest),  # which tokens it read
                 "store_fidelity": store_fidelity(inputs)}  # the worst fidelity record it read (a mark when wrong)
        if kept != "all":  # a result from a thinned store says so (its token sample is those positions)
            extra["store_positions"] = kept
        result = dataclasses.replace(result, extra=extra)
    problems = study.result.problems(result)
    if problems:
        raise ValueError(f"{study.name} broke its result declaration: " + "; ".join(problems))
    result = with_precision(study.name, result, config)
    # the layer axis at the site the run read (its config's ``site``), not the declaration's literal
    result = dataclasses.replace(result, layer_axis=study.result.layer_axis.at_site(getattr(config, "site", None)))
    figures = study.figures(result, config)
    return write_study_result(out_dir, study.name, result, config, figures, time.time() - t0)


def with_precision(name: str, result: StudyResult, config) -> StudyResult:
    """``result`` with ``extra["precision"]``: the declared headline's half-width reached and its target
    (:func:`studies.core.precision.reached`; the ``--precision`` asked for, else the declared one)."""
    precision = declared_precision(name)
    if precision is None:
        return result
    target = getattr(config, "target_half_width", 0.0) or None
    view = SimpleNamespace(summary=result.summary, metrics=result.metrics, config=_clean(config))
    record = reached(precision, view, target)
    if target and record["reached"] is False:
        log.warning("%s: the headline's 95%% interval is ±%.3g %s, wider than the ±%g asked for (a sample capped by "
                    "the store's tokens: raise --max-tokens; or one the 1/sqrt(n) estimate undersized: ask for less)",
                    name, record["half_width"], precision.unit, target)
    return dataclasses.replace(result, extra={**result.extra, "precision": record})


def write_study_result(out_dir, name: str, result: StudyResult, config=None, figures=None,
                       wall_time_s: float | None = None) -> Path:
    """The results folder of ``result`` (:func:`studies.reporting.results.write_result`) and its files."""
    out = Path(out_dir)
    try:
        for fname, obj in result.files.items():
            out.mkdir(parents=True, exist_ok=True)
            (out / RESULT_FILE).unlink(missing_ok=True)  # the folder is incomplete from here on
            obj.save(out / fname)
        return write_result(out, study=name, model=result.model, corpus=result.corpus, n_tokens=result.n_tokens,
                            config=config, layers=result.layers, metrics=result.metrics, summary=result.summary,
                            arrays=result.arrays, figures=figures, wall_time_s=wall_time_s, extra=result.extra,
                            layer_axis=None if result.layer_axis is None else result.layer_axis.to_dict())
    except BaseException:  # a full disk half-way through a file of the study's own: no half-written file stays
        for fname in result.files:
            target = out / fname
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target, ignore_errors=True)
            else:
                try:
                    target.unlink(missing_ok=True)
                except OSError:
                    pass
        raise
