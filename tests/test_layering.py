"""The import direction of docs/contracts.md, checked on the source: lens → geometry → probes → studies →
app (the explorer and the ``lens`` command line). A module imports only its own package and the ones
before it, never a private module (``_name``) of another package, and no study imports another study
(a study module is one registered in ``studies/core/registry.py``).

Inside ``lens`` the wings have an order of their own (``LENS_WINGS``): a module imports its own wing and the
ones before it. ``geometry`` and ``probes`` see no model: from ``lens`` they take only ``LENS_FOR_ANALYSES``.

``studies`` and ``app`` have wings too (``STUDIES_WINGS``, ``APP_WINGS``), read off the real imports (issue #41):
``core`` (contract, registry, runner, config, sampling, stats) comes first; ``reporting`` (judged headlines,
findings, the report) reads core and is read by every study's declaration (its headline getters); a study folder
(``studies/<study>/``: any folder not named in ``STUDIES_WINGS``) imports core and reporting, and from another study
folder only its declaration (plain data: tuned-lens judges the logit lens' depth claim by the same rule); ``job`` (the main job: it runs the studies and writes the report) and ``notebooks`` come last. Two file
formats sit in later wings and may be read from anywhere in ``studies`` (``FORMATS``): ``result.json``'s (the
runner in core writes it) and ``main_job.json``'s rows (the report and findings read them). In ``app`` the
explorer comes before ``commands``, the ``lens`` command line, whose ``lens app`` starts the explorer."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("lens", "geometry", "probes", "studies", "app")
# Entry points run as ``python -m PKG`` may import upward: they are not library code, and nothing imports
# them (checked below). ``lens.__main__`` starts the command line in ``app`` so that launchers that run a
# module (``torchrun -m lens capture ...``) work; the command line itself stays in ``app``.
ENTRY_POINTS = {"lens.__main__", "app.__main__"}
# The wings of lens, in the order data flows through them: shared names (errors, sites), the process runtime,
# text in, models in, stores, read-outs of stored states, capture (model + text -> store), changed forward passes.
LENS_WINGS = ("errors", "sites", "runtime", "text", "model", "store", "readout", "capturing", "interventions")
# lens.__init__ is the public face (every public name, from every wing); it may import any of them
LENS_FACADE = "lens"
# what the analyses may take from lens: errors, site names, the runtime, and the store's views and sums
LENS_FOR_ANALYSES = ("lens.errors", "lens.sites", "lens.runtime", "lens.store.views", "lens.store.stats",
                     "lens.store.layer_stats")
# The wings of studies in import order; STUDY stands for every study folder (studies/<study>/)
STUDY = "<study>"
STUDIES_WINGS = ("core", "reporting", STUDY, "job", "notebooks")
# file formats any studies module may read, whatever its wing: result.json (the runner in core writes it, the
# contract's getters read its record) and main_job.json's rows (reporting reads them)
FORMATS = ("studies.reporting.results", "studies.job.rows")
# The wings of app in import order: the explorer, then the command line (`lens app` starts the explorer)
APP_WINGS = ("explorer", "commands")


def lens_wing(module: str) -> str | None:
    """The wing of a ``lens`` module (``lens.store.reader`` -> ``store``); None for lens itself and its entry point."""
    parts = module.split(".")
    if parts[0] != "lens" or len(parts) < 2 or parts[1] in ("__main__",):
        return None
    return parts[1]


def studies_wing(module: str) -> str | None:
    """The wing of a ``studies`` module (``studies.job.pool`` -> ``job``, ``studies.senses.study`` -> ``<study>``);
    None for the package itself."""
    parts = module.split(".")
    if parts[0] != "studies" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in STUDIES_WINGS else STUDY


def app_wing(module: str) -> str | None:
    """The wing of an ``app`` module (``app.explorer.views.geometry`` -> ``explorer``); None for app itself and
    its entry point, or a module in no wing."""
    parts = module.split(".")
    return parts[1] if parts[0] == "app" and len(parts) > 1 and parts[1] in APP_WINGS else None


def wing_breach(module: str, target: str) -> str | None:
    """Why ``module`` may not import ``target`` by the wing order of studies or app; None when it may."""
    pkg, tpkg = module.split(".")[0], target.split(".")[0]
    if pkg == tpkg == "studies" and not any(target == f or target.startswith(f + ".") for f in FORMATS):
        mine, theirs = studies_wing(module), studies_wing(target)
        if mine is None or theirs is None:
            return None
        if (mine == theirs == STUDY and module.split(".")[1] != target.split(".")[1]
                and target.split(".")[2:3] != ["declaration"]):
            return "a study folder takes from another study folder more than its declaration"
        if STUDIES_WINGS.index(theirs) > STUDIES_WINGS.index(mine):
            return f"upward inside studies ({mine} comes before {theirs})"
    if pkg == tpkg == "app" and module not in ENTRY_POINTS:
        mine, theirs = app_wing(module), app_wing(target)
        if mine and theirs and APP_WINGS.index(theirs) > APP_WINGS.index(mine):
            return f"upward inside app ({mine} comes before {theirs})"
    return None


def allowed_for_analyses(target: str) -> bool:
    return any(target == a or target.startswith(a + ".") for a in LENS_FOR_ANALYSES)


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
            if pkg == tpkg == "lens" and module != LENS_FACADE and target != "lens" and target not in ENTRY_POINTS:
                mine, theirs = lens_wing(module), lens_wing(target)
                if theirs not in LENS_WINGS:
                    reasons.append(f"lens.{theirs} is in no wing of LENS_WINGS")
                elif mine in LENS_WINGS and LENS_WINGS.index(theirs) > LENS_WINGS.index(mine):
                    reasons.append(f"upward inside lens ({mine} comes before {theirs})")
            if (breach := wing_breach(module, target)) is not None:
                reasons.append(breach)
            if pkg in ("geometry", "probes") and tpkg == "lens" and not allowed_for_analyses(target):
                reasons.append("an analysis may take from lens only " + ", ".join(LENS_FOR_ANALYSES))
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
    from studies.core.registry import STUDIES

    sources = tree_sources()
    assert {"lens.capturing.capture", "geometry.linearity", "probes.linear_probe", "studies.core.runner", "app.commands.cli"} <= set(sources)
    assert ENTRY_POINTS <= set(sources)
    study_modules = {module for module, _ in STUDIES.values()}
    assert study_modules <= set(sources)
    assert violations(sources, study_modules) == []


def test_the_check_finds_each_kind_of_breach():
    planted = {
        "lens.model.loaded": ("from studies.reporting.results import write_result\n", False),           # upward
        "geometry.linearity": ("def f():\n    import probes.knn\n", False),             # upward, inside a function
        "probes.ridge": ("from geometry._arrays import lapack_threads\n", False),       # private of another package
        "studies.alpha.study": ("from studies.beta.study import helper\n", False),     # study to study
        "studies.beta.study": ("from . import declaration\nfrom ..gamma import study\n", False),  # relative, to a study
        "studies.gamma.study": ("from studies.alpha.figures import plot\n", False),    # another study folder's module
        "studies.alpha.declaration": ("from studies.reporting import headlines\nfrom studies.beta.declaration "
                                      "import RULE\n", False),                         # reporting, a declaration: fine
        "studies.core.runner": ("from studies.core.contract import Study\n"
                                "from studies.reporting.results import write_result\n", False),  # a format: fine
        "studies.core.registry": ("def f():\n    from studies.reporting.headlines import judged\n", False),
        "studies.reporting.findings": ("from studies.job.rows import JOB_FILE\nfrom studies.job.main_job import OK\n",
                                       False),                                           # rows: a format; the job: not
        "studies.reporting.headlines": ("from studies.alpha.declaration import RULE\n", False),
        "studies.job.main_job": ("from studies.reporting.report import build_report\n", False),   # fine
        "app.commands.cli": ("import lens\nfrom studies.core.registry import get_study\n", False),    # fine
        "app.commands.explorer": ("from app.explorer.launch import launch\n", False),  # fine
        "app.explorer.data": ("from app.commands.parser import build_parser\n", False),
        "app.__main__": ("from app.commands.cli import main\n", False),                # the entry point: fine
        "lens.readout.logit_lens": ("from lens.readout.row_stats import row_stats\n", False),          # private, own package: fine
        "lens.__main__": ("from app.commands.cli import main\n", False),                       # the entry point: fine
        "lens.capturing.launch": ("import lens.__main__\n", False),                              # importing it: not
        "lens.store.reader": ("from lens.capturing.pipeline import plan\nfrom lens.model.card import Card\n", False),
        "lens.runtime.cache": ("import lens.gizmo\n", False),                         # a wing nobody declared
        "geometry.moments": ("from lens.store.layer_stats import LayerStats\nfrom lens.model.loaded import M\n", False),
        "probes.knn": ("from lens.runtime.threads import pool\nimport lens.readout.logit_lens\n", False),
    }
    found = violations(planted, {"studies.alpha.study", "studies.beta.study", "studies.gamma.study"})
    assert found == [
        "app.explorer.data:1 imports app.commands.parser: upward inside app (explorer comes before commands)",
        "geometry.linearity:2 imports probes.knn: upward (geometry comes before probes)",
        "geometry.moments:2 imports lens.model.loaded: an analysis may take from lens only " + ", ".join(LENS_FOR_ANALYSES),
        "lens.capturing.launch:1 imports lens.__main__: an entry point (run with python -m, never imported)",
        "lens.model.loaded:1 imports studies.reporting.results: upward (lens comes before studies)",
        "lens.runtime.cache:1 imports lens.gizmo: lens.gizmo is in no wing of LENS_WINGS",
        "lens.store.reader:1 imports lens.capturing.pipeline: upward inside lens (store comes before capturing)",
        "probes.knn:2 imports lens.readout.logit_lens: an analysis may take from lens only " + ", ".join(LENS_FOR_ANALYSES),
        "probes.ridge:1 imports geometry._arrays: a private module of another package",
        "studies.alpha.study:1 imports studies.beta.study: a study folder takes from another study folder more than "
        "its declaration",
        "studies.alpha.study:1 imports studies.beta.study: a study imports another study",
        "studies.beta.study:2 imports studies.gamma.study: a study imports another study",
        "studies.beta.study:2 imports studies.gamma: a study folder takes from another study folder more than its "
        "declaration",
        "studies.core.registry:2 imports studies.reporting.headlines: upward inside studies (core comes before "
        "reporting)",
        "studies.gamma.study:1 imports studies.alpha.figures: a study folder takes from another study folder more "
        "than its declaration",
        "studies.reporting.findings:2 imports studies.job.main_job: upward inside studies (reporting comes before job)",
        "studies.reporting.headlines:1 imports studies.alpha.declaration: upward inside studies (reporting comes "
        "before <study>)",
    ]


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module -> the project modules it imports, at any depth (inside functions too). ``from a.b import c`` is an
    edge to ``a.b.c`` when that is a module, else to ``a.b``; a package's ``__init__`` run on the way is no edge."""
    graph = {}
    for module, (source, is_package) in sources.items():
        found = imports(module, source, is_package)
        graph[module] = {target for target, line in found if target in sources and target != module
                         and not any(other.startswith(target + ".") and other in sources
                                     for other, at in found if at == line)}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import circles as the modules along each, from its smallest name back to it (``[a, b, a]``): a depth-first
    walk that reports every edge back to a module still on the path, so every tangle shows at least one."""
    circles, done = set(), set()

    def walk(module, path, on_path):
        path.append(module)
        on_path.add(module)
        for target in sorted(graph.get(module, ())):
            if target in on_path:
                loop = path[path.index(target):]
                start = loop.index(min(loop))
                circles.add(tuple(loop[start:] + loop[:start]))
            elif target not in done:
                walk(target, path, on_path)
        on_path.discard(module)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            walk(module, [], set())
    return sorted([*loop, loop[0]] for loop in circles)


def test_no_module_imports_itself_round_a_circle():
    circles = import_circles(import_graph(tree_sources()))
    assert circles == [], "\n".join(" -> ".join(c) for c in circles)


def test_the_circle_check_finds_a_planted_one():
    planted = {
        "lens.model.loading": ("from lens.model.gguf import check_magic\n", False),
        "lens.model.gguf": ("def f():\n    from lens.model import loading\n", False),  # inside a function: counts
        "lens.model": ("", True),
        "studies.job.main_job": ("import studies.reporting.report\n", False),
        "studies.reporting.report": ("from studies.reporting.results import write\n", False),                # no way back: fine
        "studies.reporting.results": ("from . import report\n", False),                            # relative: counts
        "lens.store.format": ("from lens.store import schema\n", False),                 # a one-way edge: fine
        "lens.store.schema": ("import numpy\n", False),
        "lens.store": ("", True),
    }
    graph = import_graph(planted)
    assert graph["lens.model.gguf"] == {"lens.model.loading"}
    assert import_circles(graph) == [
        ["lens.model.gguf", "lens.model.loading", "lens.model.gguf"],
        ["studies.reporting.report", "studies.reporting.results", "studies.reporting.report"],
    ]
