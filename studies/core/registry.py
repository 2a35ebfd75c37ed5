"""Every study the command line, the main job, the report and the explorer know, by name.

Each entry names a module holding ``STUDY`` (a :class:`studies.core.contract.Study`): a study's folder
(``studies/<study>/``) holds its compute (``study.py``, the module named here) and its plain-data declaration
(``declaration.py``) together. Adding a study is one module plus one line here (docs/adding_a_study.md).

Kept cheap to import (no torch at import time; of ``lens`` only its errors): ``lens --help`` and ``lens study --help``
list :data:`STUDIES` from here, and answer in well under a second (tests/app/commands/test_cli.py checks).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util

from lens.errors import LensInputError

STUDIES: dict[str, tuple[str, str]] = {
    # name: (module, one-line description)
    "prediction-gains": ("studies.prediction_gains.study", "per-layer prediction residual (He & Su 2024 equi-learning law)"),
    "logit-lens": ("studies.logit_lens.study", "decode every layer through the final norm + unembedding"),
    "tuned-lens": ("studies.tuned_lens.study", "affine translators per layer trained to the final layer"),
    "layer-ablation": ("studies.layer_ablation.study", "delete one layer / swap two adjacent layers"),
    "depth-use": ("studies.depth_use.study", "relative update per layer and the effect of skipping it (Csordás et al. 2025)"),
    "intrinsic-dim": ("studies.intrinsic_dim.study", "TwoNN / MLE intrinsic dimension per layer with a shuffled control"),
    "anisotropy": ("studies.anisotropy.study", "anisotropy, rogue dimensions and outlier neurons per layer"),
    "linearity": ("studies.linearity.study", "token linearity between consecutive layers"),
    "senses": ("studies.senses.study", "word-sense separation per layer (WordNet examples)"),
    "probes": ("studies.probes_study.study", "linear probes per layer with control tasks"),
    "context-memory": ("studies.context_memory.study", "how much of the prefix a token's state holds"),
    "filler-tokens": ("studies.filler_tokens.study", "loss after removing filler tokens vs random tokens"),
    "context-knob": ("studies.context_knob.study", "the 1-D knob between context and prior knowledge"),
}


def available() -> dict[str, str]:
    """Studies whose module exists in this checkout."""
    out = {}
    for name, (module, desc) in STUDIES.items():
        if importlib.util.find_spec(module) is not None:
            out[name] = desc
    return out


def get_study(name: str):
    """The registered study ``name`` (:class:`studies.core.contract.Study`, its name and description set)."""
    if name not in STUDIES:
        raise LensInputError(f"unknown study {name!r}: expected one of {', '.join(STUDIES)}")
    module_name, description = STUDIES[name]
    if importlib.util.find_spec(module_name) is None:
        raise LensInputError(f"study {name!r} is not available in this version (module {module_name} missing)")
    study = getattr(importlib.import_module(module_name), "STUDY", None)
    if study is None:
        raise LensInputError(f"module {module_name} registered as study {name!r} has no STUDY")
    return dataclasses.replace(study, name=name, description=description)


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What a registered study declares, read from its plain-data module
    (``studies.<study>.declaration``) without importing its compute code or torch: the explorer and
    the report use this; the runner and the main job use :func:`get_study`."""

    name: str
    description: str
    result: object  # studies.core.contract.ResultSpec
    headlines: tuple = ()
    claims: tuple = ()


def declaration_module(name: str) -> str:
    """The plain-data module of the registered study ``name``: ``declaration`` beside its compute module in the
    study's folder (``studies.senses.study`` -> ``studies.senses.declaration``)."""
    return STUDIES[name][0].rsplit(".", 1)[0] + ".declaration"


def declaration(name: str) -> Declaration | None:
    """The registered study ``name``'s declaration, or None (an unregistered or removed study). Read
    from its plain-data module; a study that keeps its declarations in its own module (the one-module
    study of docs/adding_a_study.md) is read from that module's ``STUDY``."""
    if name not in STUDIES:
        return None
    module_name = declaration_module(name)
    try:
        found = importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        study = find_study(name)
        return None if study is None else Declaration(name=name, description=study.description,
                                                      result=study.result, headlines=tuple(study.headlines),
                                                      claims=tuple(study.claims))
    mod = importlib.import_module(module_name)
    return Declaration(name=name, description=STUDIES[name][1], result=mod.RESULT,
                       headlines=tuple(getattr(mod, "HEADLINES", ())), claims=tuple(getattr(mod, "CLAIMS", ())))


def find_study(name: str):
    """The registered study ``name``, or None (results of unregistered or removed studies)."""
    try:
        return get_study(name)
    except LensInputError:
        return None
