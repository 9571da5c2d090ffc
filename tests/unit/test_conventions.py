"""Conventions ARCHITECTURE.md states, checked: a module's docstring says what and why in at
most 30 lines."""
from __future__ import annotations

import ast

import pytest

from tests.side_venv import REPO

PACKAGES = ("service", "transforms", "pipeline", "embedpipe", "configs", "tools")
MODULES = sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_a_module_docstring_is_at_most_30_lines(path):
    tree = ast.parse(path.read_text())
    doc = tree.body[0] if tree.body and isinstance(tree.body[0], ast.Expr) else None
    if doc is None or not isinstance(doc.value, ast.Constant) or not isinstance(doc.value.value, str):
        return
    assert doc.end_lineno - doc.lineno + 1 <= 30
