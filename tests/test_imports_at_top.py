"""Imports at module top (issue #41), checked on the source with ast: an import inside a function hides what a
module needs and pays its cost at a surprising moment. One may stay inside a function only where

(a) the module is behind a cheap door — ``lens --help`` (every ``app/commands`` module) or the explorer's data
    layer (``app/explorer/data.py`` and every study's ``declaration.py``): a module those load at import time, or
    one their functions reach without loading a heavy library (``HEAVY``) — and the import loads a heavy library
    the door does not load at import time (torch directly, or through a project module), all followed from the
    source;
(b) it imports an optional library: one that installing the project does not install (not a dependency in
    pyproject.toml's ``[project] dependencies``, nor a dependency of one);
(c) its line says why: ``# lazy: <reason>`` (an import circle that cannot be broken, an import cost every command
    would pay).

The doors themselves are held torch-free at run time by tests/app/commands/test_cli.py; this test holds the rest
of the tree to imports at the top."""

from __future__ import annotations

import ast
import functools
import importlib.metadata as metadata
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (pyproject's floor): its dependencies read by hand below
    tomllib = None

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lens", "geometry", "probes", "studies", "app")
# Libraries a cheap door must not load for nothing: torch and what brings it, and the scientific stack's slower
# imports (each ~0.2-4 s here, numpy ~0.1-0.5 s). A cheap door keeps them in its functions; so does a module that a
# door's functions reach without them (lens.capturing.settings: the flags' help is built from it on `lens --help`).
HEAVY = ("torch", "transformers", "transformer_lens", "nnsight", "sklearn", "scipy", "numba", "skdim", "numpy",
         "datasets", "zarr", "xarray", "dask", "gensim", "nltk", "gguf", "streamlit")
LAZY = re.compile(r"#\s*lazy:\s*\S")
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@dataclass(frozen=True)
class Source:
    path: str  # relative to the root, for messages
    text: str
    is_package: bool


def tree_sources(root: Path = ROOT) -> dict[str, Source]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root)
            out[module_name(rel)] = Source(str(rel), path.read_text(encoding="utf-8"), path.name == "__init__.py")
    return out


# --- what an import statement brings ------------------------------------------------------------------------------

def targets(module: str, src: Source, node: ast.Import | ast.ImportFrom, project: set[str]) -> list[str]:
    """The modules one statement imports: a project module by its full name (``from a.b import c`` is ``a.b.c``
    when that is a module, else ``a.b``), any other by its top-level name (``torch``)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            here = module.split(".") if src.is_package else module.split(".")[:-1]
            base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in project else base for a in node.names]
    return sorted({n if n.split(".")[0] in PACKAGES else n.split(".")[0] for n in names})


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and ast.unparse(test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def import_nodes(tree: ast.AST) -> tuple[list[ast.stmt], list[tuple[ast.stmt, str]]]:
    """(the imports run when the module is imported, [(an import inside a function, that function's name)]);
    imports under ``if TYPE_CHECKING:`` are neither."""
    top, inside = [], []

    def walk(node, function):
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (inside.append((child, function)) if function else top.append(child))
            name = getattr(child, "name", "<lambda>") if isinstance(child, FUNCTIONS) else None
            walk(child, name or function)

    walk(tree, None)
    return top, inside


def with_parents(module: str, project: set[str]) -> list[str]:
    """A project module and the packages above it (importing ``a.b.c`` runs ``a`` and ``a.b`` first)."""
    parts = module.split(".")
    return [m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if m in project]


@dataclass(frozen=True)
class Door:
    members: frozenset[str]  # the project modules behind it
    heavy: frozenset[str]  # the heavy libraries it does not load at import time


class Tree:
    def __init__(self, sources: dict[str, Source]):
        self.sources = sources
        self.project = set(sources)
        self.parsed = {m: ast.parse(s.text) for m, s in sources.items()}
        self.top = {m: sorted({t for node in import_nodes(tree)[0] for t in targets(m, sources[m], node, self.project)})
                    for m, tree in self.parsed.items()}

    def loaded(self, *modules: str) -> set[str]:
        """Every module importing ``modules`` runs: project modules by full name, other libraries by top name."""
        seen, todo = set(), [m for module in modules for m in with_parents(module, self.project) or [module]]
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.add(m)
            for t in self.top.get(m, ()):
                todo += with_parents(t, self.project) if t.split(".")[0] in PACKAGES else [t]
        return seen

    def inside(self, module: str) -> list[str]:
        """What ``module`` imports inside its functions."""
        return sorted({t for node, _ in import_nodes(self.parsed[module])[1]
                       for t in targets(module, self.sources[module], node, self.project)})

    def door(self, *roots: str) -> Door:
        """A cheap door: what its roots load at import time, and every module its functions reach without
        loading a heavy library more (those modules keep their own heavy imports inside too, and only those)."""
        paid = self.loaded(*roots)
        heavy = set(HEAVY) - paid
        members, todo = set(), [m for m in paid if m in self.project]
        while todo:
            m = todo.pop()
            if m in members:
                continue
            members.add(m)
            for t in self.inside(m):
                if t in self.project and not self.loaded(t) & heavy:
                    todo += [x for x in self.loaded(t) if x in self.project]
        return Door(frozenset(members), frozenset(heavy))

    def doors(self) -> dict[str, Door]:
        """``lens --help`` (every app/commands module) and the explorer's data layer (app/explorer/data.py and
        every study's declaration)."""
        commands = [m for m in self.project if m.startswith("app.commands.")]
        data = ["app.explorer.data"] + [m for m in self.project if m.startswith("studies.")
                                        and m.endswith(".declaration")]
        return {"lens --help": self.door(*commands), "explorer data layer": self.door(*data)}


# --- which libraries are optional ---------------------------------------------------------------------------------

def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_dependencies(text: str) -> list[str]:
    """pyproject.toml's ``[project] dependencies``."""
    if tomllib is not None:
        return tomllib.loads(text)["project"]["dependencies"]
    block = re.search(r"^\[project\].*?^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    return re.findall(r'^\s*"([^"]+)"', block, re.M)


def installed_with_project(pyproject: Path = ROOT / "pyproject.toml") -> set[str]:
    """The distributions `pip install .` brings: pyproject's dependencies and, installed here, theirs."""
    todo = [(Requirement(r), None) for r in declared_dependencies(pyproject.read_text())]
    seen: set[str] = set()
    while todo:
        req, parent_extras = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in parent_extras or {""}):
            continue
        name = _canon(req.name)
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            todo += [(Requirement(r), req.extras) for r in metadata.requires(req.name) or []]
        except metadata.PackageNotFoundError:
            pass
    return {k.split("[")[0] for k in seen}


@functools.cache
def _provided() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def optional_libraries(names: set[str], installed: set[str]) -> set[str]:
    """Which top-level import names no installed-with-the-project distribution provides (stdlib excluded)."""
    provided = _provided()
    return {n for n in names if n not in sys.stdlib_module_names and n not in PACKAGES
            and not {_canon(d) for d in provided.get(n, [])} & installed}


# --- the check ----------------------------------------------------------------------------------------------------

def offenders(sources: dict[str, Source], installed: set[str]) -> list[str]:
    """``path:line imports X inside f()`` for every import inside a function that none of (a), (b), (c) allows."""
    tree = Tree(sources)
    doors = tree.doors()
    found = []
    for module, parsed in tree.parsed.items():
        src = sources[module]
        lines = src.text.splitlines()
        mine = [door for door in doors.values() if module in door.members]
        for node, function in import_nodes(parsed)[1]:
            if any(LAZY.search(lines[i - 1]) for i in range(node.lineno, node.end_lineno + 1)):
                continue  # (c)
            names = targets(module, src, node, tree.project)
            external = {n for n in names if n.split(".")[0] not in PACKAGES}
            if external and external <= optional_libraries(external, installed):
                continue  # (b)
            brings = {m for n in names for m in tree.loaded(n)}
            if any(brings & door.heavy for door in mine):
                continue  # (a)
            found.append(f"{src.path}:{node.lineno} imports {', '.join(names)} inside {function}()")
    return sorted(found, key=lambda line: (line.split(":")[0], int(line.split(":")[1].split()[0])))


def test_imports_sit_at_module_top():
    found = offenders(tree_sources(), installed_with_project())
    if found:
        pytest.fail(f"{len(found)} imports inside functions:\n" + "\n".join(found), pytrace=False)


def test_the_check_finds_a_planted_offender():
    def src(path, text):
        return Source(path, text, path.endswith("__init__.py"))

    planted = {
        "app": src("app/__init__.py", ""),
        "app.commands": src("app/commands/__init__.py", ""),
        "app.commands.cli": src("app/commands/cli.py", "import os\nfrom app.commands import models\n"),
        "app.commands.models": src("app/commands/models.py", (
            "from lens.errors import LensInputError\n"
            "def run(args):\n"
            "    import lens.model.loading\n"                 # (a) torch behind the --help door: fine
            "    from lens.errors import StoreCorruptError\n"  # the door loads it already: move it up
            "    import json\n"                                # stdlib: move it up
            "    from lens.capturing import settings\n")),     # torch-free: move it up
        "lens": src("lens/__init__.py", ""),
        "lens.errors": src("lens/errors.py", "import json\n"),
        "lens.capturing": src("lens/capturing/__init__.py", ""),
        "lens.capturing.settings": src("lens/capturing/settings.py", (  # reached from the door without torch
            "def resolve():\n"
            "    from lens.model import loading\n"             # (a): fine
            "    from lens.model import card\n")),             # (a) numpy is heavy for this door: fine
        "lens.model": src("lens/model/__init__.py", ""),
        "lens.model.loading": src("lens/model/loading.py", "import torch\ndef f():\n    from lens.model import card\n"),
        "lens.model.card": src("lens/model/card.py", "import numpy\n"),
        "geometry": src("geometry/__init__.py", ""),
        "geometry.linearity": src("geometry/linearity.py", (
            "def f():\n"
            "    import numpy as np\n"                         # behind no door: move it up
            "    from lens.model import card\n"                # same
            "    import nbclient\n"                            # (b) optional: fine
            "    from lens.model.loading import load  # lazy: import circle with lens.model\n"  # (c): fine
            "    import torch  # lazy:\n"                      # (c) without a reason: not fine
            "    g = lambda: __import__('x')\n"
            "    class K:\n"
            "        def m(self):\n"
            "            from . import other\n")),             # relative, in a method
        "geometry.other": src("geometry/other.py", "if TYPE_CHECKING:\n    import torch\n"),
    }
    tree = Tree(planted)
    assert tree.doors()["lens --help"].members >= {"app.commands.models", "lens.errors", "lens.capturing.settings"}
    assert "lens.model.loading" not in tree.doors()["lens --help"].members
    found = offenders(planted, installed={"numpy", "torch"})
    assert found == [
        "app/commands/models.py:4 imports lens.errors inside run()",
        "app/commands/models.py:5 imports json inside run()",
        "app/commands/models.py:6 imports lens.capturing.settings inside run()",
        "geometry/linearity.py:2 imports numpy inside f()",
        "geometry/linearity.py:3 imports lens.model.card inside f()",
        "geometry/linearity.py:6 imports torch inside f()",
        "geometry/linearity.py:10 imports geometry.other inside m()",
        "lens/model/loading.py:3 imports lens.model.card inside f()",
    ]
