"""What the main job settles before any study runs (:mod:`studies.job.main_job`): which studies, each one's
config (the shared settings, ``--param`` values, ``--precision`` targets; each study's own check), and the
shared store (refused when it is another model's, captured once, or a study's own when it does not fit)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import lens
from lens.errors import LensInputError
from studies.core.config import StudyConfig, config_from_dict, field_names, with_model_settings
from studies.core.precision import renamed_params, target_params
from studies.core.registry import STUDIES, available
from studies.core.runner import config_model, sites_for, store_exists, store_problem

log = logging.getLogger("studies.job.main_job")  # the job's logger, as before the cut


def select_studies(only=None) -> list[str]:
    """Available study names, in registry order, restricted to ``only`` (comma string or list)."""
    names = list(available())
    if only is None or only == "":
        return names
    wanted = [s.strip() for s in (only.split(",") if isinstance(only, str) else only) if s.strip()]
    unknown = [s for s in wanted if s not in STUDIES]
    if unknown:
        raise LensInputError(f"--only: unknown studies {', '.join(unknown)} (expected some of {', '.join(STUDIES)})")
    missing = [s for s in wanted if s not in names]
    if missing:
        raise LensInputError(f"--only: studies not available in this version: {', '.join(missing)}")
    return [s for s in names if s in wanted]


def shared_config(base) -> StudyConfig:
    """The job's shared settings as one :class:`studies.core.config.StudyConfig`, built once: ``base`` is one
    already, or a dict of its fields (keys it has no field for are left out) over its defaults (which are
    :class:`lens.capturing.spec.CaptureSpec`'s), with the model settings resolved."""
    if not isinstance(base, StudyConfig):
        base = config_from_dict(StudyConfig, {k: v for k, v in dict(base).items() if k in field_names(StudyConfig)})
    if type(base) is not StudyConfig:  # a study's own config: only the shared parts and run arguments
        base = StudyConfig(**shared_values(base))
    return with_model_settings(base)


def shared_values(config) -> dict:
    """The fields every config has (the settings' parts and the run's arguments) of ``config``, by name."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(StudyConfig)}


def _configs(studies: dict, shared, params: dict, targets: dict | None = None) -> dict:
    """Each study's config: the shared fields, the ``--param`` values it has a field for and what a
    ``--precision`` target asks of it (``targets``: {study: half-width}; :func:`studies.core.precision.target_params`)."""
    params = renamed_params(params, set().union(*(field_names(s.config) for s in studies.values())))
    for key in params:
        if not any(key.replace("-", "_") in field_names(s.config) for s in studies.values()):
            raise LensInputError(f"--param {key}: none of the selected studies has this parameter")
    base = shared_values(shared)  # the parts and the run's arguments; a study's --param over them
    out = {}
    for name, study in studies.items():
        fields = field_names(study.config)
        values = {**base, **{k: v for k, v in params.items() if k.replace("-", "_") in fields}}
        if name in (targets or {}):
            values.update(target_params(name, targets[name]))
        out[name] = with_model_settings(config_from_dict(study.config, values))  # "auto" resolved: recorded
    return out


def _check_configs(studies: dict, configs: dict) -> None:
    """Each study's own validation (:attr:`studies.core.contract.Study.check`: nothing loaded) before anything
    runs: a bad ``--param`` is refused with the one line ``lens study NAME`` gives, not found by a worker
    half-way through the job."""
    for name, study in studies.items():
        if study.check is None:
            continue
        try:
            study.check(configs[name])
        except LensInputError as exc:
            text = str(exc)
            raise type(exc)(text if text.startswith(f"{name}:") else f"{name}: {text}") from None


def _shared_store_path(shared, out: Path) -> Path:
    return Path(shared.store) if shared.store else out / "store"


def _refuse_foreign_store(shared, out: Path) -> None:
    """Refuse, before anything is written, a shared store (``--store``, else ``OUT/store`` of an earlier
    job) captured from another model or with other model settings: it is neither to share nor to
    resume, and every study would quietly capture a store of its own instead."""
    path = _shared_store_path(shared, out)
    if not store_exists(path):
        return
    settings = with_model_settings(shared)
    problem = store_problem(lens.open_store(path), settings.model, (), settings.model_dtype, settings.attn,
                            who="this job", sample=None if shared.store else (shared.sample, shared.sample_seed))
    if problem:
        fix = "pass a store of this model (or leave --store out)" if shared.store else \
            "choose another --out, or run this model in its own results folder"
        raise LensInputError(f"{problem}: {fix}")


def _shared_store(shared, out: Path, studies: dict, configs: dict, progress: bool) -> str | None:
    """Capture, once, every site the studies declare (resuming an interrupted capture) with the shared
    settings (``shared``: :func:`shared_config`); its path, or None when no study reads a store."""
    path = _shared_store_path(shared, out)
    if store_exists(path) and lens.open_store(path).complete:
        return str(path)
    model = config_model(shared)
    card = model.card()
    sites = []
    for name, study in studies.items():
        try:
            sites += [s for s in sites_for(study.needs(configs[name]), card) if s not in sites]
        except LensInputError as exc:  # a site this family lacks: that study fails alone, later
            log.warning("%s: %s", name, exc)
    if not sites:
        return None
    lens.capture(model, spec=shared.capture_spec(sites), out=str(path), resume=store_exists(path), progress=progress)
    return str(path)


def _fitted(study, config, store_path: str | None, out: Path):
    """``config`` reading the shared store when it holds what the study needs, else a store of its own."""
    needs = study.needs(config)
    if store_path is None or not (needs.reads_store or needs.tokens):
        return dataclasses.replace(config, store=store_path)
    store = lens.open_store(store_path)
    try:
        problem = store_problem(store, config.model, sites_for(needs, store.card) if needs.reads_store else (),
                                config.model_dtype, config.attn)
    except LensInputError:
        problem = None  # a site this family lacks: the study itself says so
    if problem is None:
        return dataclasses.replace(config, store=store_path)
    log.warning("%s: the shared store does not fit (%s); capturing its own", study.name, problem)
    return dataclasses.replace(config, store=str(out / study.name / "store"))
