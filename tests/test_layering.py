"""The import direction of docs/contracts.md, checked on the source: lens → geometry → probes → studies →
app (the explorer and the ``lens`` command line). A module imports only its own package and the ones
before it, never a private module (``_name``) of another package, and no study imports another study
(a study module is one registered in ``studies/registry.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("lens", "geometry", "probes", "studies", "app")
# Entry points run as ``python -m PKG`` may import upward: they are not library code, and nothing imports
# them (checked below). ``lens.__main__`` starts the command line in ``app`` so that launchers that run a
# module (``torchrun -m lens capture ...``) work; the command line itself stays in ``app``.
ENTRY_POINTS = {"lens.__main__"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(module: str, source: str, is_package: bool = False) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement, at any depth; relative ones resolved."""
    out = []
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            out.append((base, node.lineno))
            out += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]  # `from pkg import module`
    return out


def violations(sources: dict[str, tuple[str, bool]], study_modules: set[str]) -> list[str]:
    """Every import that breaks the direction, one line per statement and breach;
    ``sources``: module -> (source, is_package)."""
    found = {}
    for module, (source, is_package) in sources.items():
        pkg = module.split(".")[0]
        if pkg not in LAYERS:
            continue
        for target, line in imports(module, source, is_package):
            tpkg = target.split(".")[0]
            if tpkg not in LAYERS or target == module:
                continue
            reasons = []
            if target in ENTRY_POINTS:
                reasons.append("an entry point (run with python -m, never imported)")
            if LAYERS.index(tpkg) > LAYERS.index(pkg) and module not in ENTRY_POINTS:
                reasons.append(f"upward ({pkg} comes before {tpkg})")
            if tpkg != pkg and any(p.startswith("_") and not p.startswith("__") for p in target.split(".")[1:]):
                reasons.append("a private module of another package")
            if module in study_modules and target in study_modules:
                reasons.append("a study imports another study")
            for reason in reasons:  # `from a.b import c` is checked as a.b and a.b.c: keep the shorter
                key = (module, line, reason)
                if key not in found or len(target) < len(found[key]):
                    found[key] = target
    return sorted(f"{m}:{line} imports {t}: {reason}" for (m, line, reason), t in found.items())


def tree_sources() -> dict[str, tuple[str, bool]]:
    out = {}
    for pkg in LAYERS:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[module_name(path)] = (path.read_text(encoding="utf-8"), path.name == "__init__.py")
    return out


def test_the_tree_imports_only_downward():
    from studies.registry import STUDIES

    sources = tree_sources()
    assert {"lens.capture", "geometry.linearity", "probes.linear_probe", "studies.runner", "app.cli"} <= set(sources)
    assert ENTRY_POINTS <= set(sources)
    study_modules = {module for module, _ in STUDIES.values()}
    assert study_modules <= set(sources)
    assert violations(sources, study_modules) == []


def test_the_check_finds_each_kind_of_breach():
    planted = {
        "lens.model": ("from studies.results import write_result\n", False),           # upward
        "geometry.linearity": ("def f():\n    import probes.knn\n", False),             # upward, inside a function
        "probes.ridge": ("from geometry._arrays import lapack_threads\n", False),       # private of another package
        "studies.alpha": ("from studies.beta import helper\n", False),                 # study to study
        "studies.beta": ("from . import gamma\nfrom .runner import run_study\n", False),  # relative, to a study
        "studies.gamma": ("import numpy\n", False),
        "studies.runner": ("from studies.contract import Study\n", False),              # fine
        "app.cli": ("import lens\nfrom studies.registry import get_study\n", False),    # fine
        "lens.logit_lens": ("from lens._row_stats import row_stats\n", False),          # private, own package: fine
        "lens.__main__": ("from app.cli import main\n", False),                       # the entry point: fine
        "lens.launch": ("import lens.__main__\n", False),                              # importing it: not
    }
    found = violations(planted, {"studies.alpha", "studies.beta", "studies.gamma"})
    assert found == [
        "geometry.linearity:2 imports probes.knn: upward (geometry comes before probes)",
        "lens.launch:1 imports lens.__main__: an entry point (run with python -m, never imported)",
        "lens.model:1 imports studies.results: upward (lens comes before studies)",
        "probes.ridge:1 imports geometry._arrays: a private module of another package",
        "studies.alpha:1 imports studies.beta: a study imports another study",
        "studies.beta:1 imports studies.gamma: a study imports another study",
    ]
