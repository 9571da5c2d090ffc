"""Conventions ARCHITECTURE.md states, checked: a module's docstring says what and why in at
most 30 lines; mypy checks every package, strictly where every function is annotated."""
from __future__ import annotations

import ast
import configparser
import re
from pathlib import Path

import pytest

from tests.side_venv import REPO

# every package of the project but the tests'
PACKAGES = tuple(sorted({p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests"}))
MODULES = sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_a_module_docstring_is_at_most_30_lines(path):
    tree = ast.parse(path.read_text())
    doc = tree.body[0] if tree.body and isinstance(tree.body[0], ast.Expr) else None
    if doc is None or not isinstance(doc.value, ast.Constant) or not isinstance(doc.value.value, str):
        return
    assert doc.end_lineno - doc.lineno + 1 <= 30


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unannotated(tree: ast.Module) -> list[str]:
    """The functions mypy's disallow_untyped_defs and disallow_incomplete_defs would report: an
    argument (but a method's first) or the return (but __init__'s, once an argument is) without
    an annotation."""
    methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body
               if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
               and not any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in f.decorator_list)}
    found = []
    for f in ast.walk(tree):
        if not isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        a = f.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
        if id(f) in methods and (a.posonlyargs or a.args):
            params.remove((a.posonlyargs or a.args)[0])
        typed = [p.annotation is not None for p in params]
        if not all(typed) or (f.returns is None and not (f.name == "__init__" and any(typed))):
            found.append(f"{f.name} (line {f.lineno})")
    return found


def _mypy_ini() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(REPO / "mypy.ini")
    return config


def test_mypy_checks_every_package_strictly_by_default():
    config = _mypy_ini()
    assert sorted(f.strip() for f in config["mypy"]["files"].split(",")) == sorted(PACKAGES)
    strict = next(s for s in config.sections() if config[s].get("disallow_untyped_defs") == "True")
    assert set(strict[len("mypy-"):].split(",")) == {m for p in PACKAGES for m in (p, f"{p}.*")}


def test_mypy_relaxes_exactly_the_modules_with_a_function_left_unannotated():
    """The modules of mypy.ini's relaxed sections are those with a function left unannotated,
    found here from their source: a module annotated in full is checked strictly."""
    config = _mypy_ini()
    excluded = re.compile(config["mypy"].get("exclude", "(?!)"))
    relaxed = {m for s in config.sections() if config[s].get("disallow_untyped_defs") == "False"
               for m in s[len("mypy-"):].split(",")}
    unannotated = {_module(path): found for path in MODULES
                   if not excluded.search(path.relative_to(REPO).as_posix())
                   and (found := _unannotated(ast.parse(path.read_text())))}
    add, remove = sorted(unannotated.keys() - relaxed), sorted(relaxed - unannotated.keys())
    assert not add and not remove, (
        f"mypy.ini's relaxed sections: add {add} (a function left unannotated: "
        f"{ {m: unannotated[m][:3] for m in add} }), remove {remove} (every function annotated: strict now, "
        "so fix what make lint says of them)")
