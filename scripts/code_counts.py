"""The counts issue #41's closing note asks for, read off the source with ast: lines per wing, imports inside
functions (of all imports), functions over 80 lines, modules over 450 lines, and the README's word count.

    .venv/bin/python scripts/code_counts.py [ROOT] [--imports]   # --imports: list each import inside a function
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

PACKAGES = ("lens", "geometry", "probes", "studies", "app")
WINGED = ("lens", "studies", "app")  # packages whose sub-folders are wings
STUDIES_MACHINERY = ("core", "job", "reporting", "notebooks")
LONG_FUNCTION, BIG_MODULE = 80, 450


def wing_of(path: Path) -> str:
    """``lens/store`` for lens/store/reader.py; every study folder counts as one wing (``studies/<study>``)."""
    pkg, *rest = path.parts
    if pkg not in WINGED or len(rest) < 2:
        return pkg
    if pkg == "studies" and rest[0] not in STUDIES_MACHINERY:
        return "studies/<study>"
    return f"{pkg}/{rest[0]}"


def imports_inside_functions(tree: ast.AST) -> tuple[list[ast.stmt], int]:
    """(the import statements inside a function body, every import statement) of one module."""
    inside, total = [], 0

    def walk(node, in_function):
        nonlocal total
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                total += 1
                if in_function:
                    inside.append(child)
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(tree, False)
    return inside, total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default=".")
    ap.add_argument("--imports", action="store_true", help="list every import inside a function")
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    lines, long_functions, big_modules, listed = Counter(), [], [], []
    n_inside = n_total = 0
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root)
            text = path.read_text(encoding="utf-8")
            n = len(text.splitlines())
            lines[wing_of(rel)] += n
            if n > BIG_MODULE:
                big_modules.append((n, str(rel)))
            tree = ast.parse(text)
            inside, total = imports_inside_functions(tree)
            n_inside, n_total = n_inside + len(inside), n_total + total
            listed += [f"{rel}:{node.lineno}: {ast.unparse(node)}" for node in inside]
            long_functions += [(node.end_lineno - node.lineno + 1, f"{rel}:{node.lineno} {node.name}")
                               for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                               and node.end_lineno - node.lineno + 1 > LONG_FUNCTION]
    print("lines per wing:")
    for wing, n in sorted(lines.items()):
        print(f"  {wing:<22} {n:>6}")
    print(f"imports inside functions: {n_inside} of {n_total} ({n_inside / max(n_total, 1):.0%})")
    print(f"functions over {LONG_FUNCTION} lines: {len(long_functions)}")
    for n, name in sorted(long_functions, reverse=True):
        print(f"  {n:>4}  {name}")
    print(f"modules over {BIG_MODULE} lines: {len(big_modules)}")
    for n, name in sorted(big_modules, reverse=True):
        print(f"  {n:>4}  {name}")
    readme = root / "README.md"
    if readme.is_file():
        print(f"README.md: {len(readme.read_text(encoding='utf-8').split())} words")
    if args.imports:
        print("\n".join(listed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
