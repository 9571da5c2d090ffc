"""The pyarrow/numpy recipe of docs/outputs.md ("Reading the vectors"), run as written on a real run's
outputs, gives the answer computed row by row; the other engines' recipes run in `make interop`."""
from __future__ import annotations

import sys

import pytest

from tests.readme_recipes import assert_same_answer, embedded_topics, expected, recipes, run_recipe


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    with embedded_topics(tmp_path_factory.mktemp("recipes")) as workdir:
        yield workdir


def test_the_docs_have_a_recipe_per_engine():
    assert set(recipes()) == {"duckdb", "polars", "clickhouse", "pyarrow"}


def test_pyarrow_recipe_gives_the_answer(workdir):
    assert_same_answer(run_recipe(sys.executable, "pyarrow", workdir), expected(workdir), "pyarrow")
