"""A real run's outputs queried in DuckDB, Polars, ClickHouse (chdb) and pyarrow/numpy with the
recipes of docs/outputs.md ("Reading the vectors"), each in .venv-interop (built on first use, see
interop_venv.py): nearest neighbours of one chunk joined back to the input, and the cost per
source row, the same answer from every engine. `make interop` runs these; `make test` does not."""
from __future__ import annotations

import subprocess

import pytest

from tests.interop.interop_venv import INTEROP
from tests.readme_recipes import assert_same_answer, embedded_topics, expected, recipes, run_recipe

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module")
def python():
    return INTEROP.ensure()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    with embedded_topics(tmp_path_factory.mktemp("interop")) as workdir:
        yield workdir


@pytest.mark.parametrize("engine", ["duckdb", "polars", "clickhouse", "pyarrow"])
def test_every_engine_gives_the_same_answer(python, workdir, engine):
    assert engine in recipes()
    assert_same_answer(run_recipe(python, engine, workdir), expected(workdir), engine)


# What each engine makes of `embedding`: no Nullable elements, so vector functions apply as is.
READ_TYPES = {
    "duckdb": ("import duckdb; print(duckdb.sql(\"SELECT typeof(embedding) FROM 'out/current/embeddings-*.parquet' "
               "LIMIT 1\").fetchall()[0][0])", "FLOAT[]"),
    "polars": ("import polars as pl; print(pl.read_parquet('out/current/embeddings-*.parquet').schema['embedding'])",
               "Array(Float32, shape=(1536,))"),
    "clickhouse": ("import chdb; print(chdb.query(\"SELECT toTypeName(embedding) FROM "
                   "file('out/current/embeddings-*.parquet') LIMIT 1\", 'TSVRaw'))", "Array(Float32)"),
}


@pytest.mark.parametrize("engine", READ_TYPES)
def test_engines_read_the_vector_without_nullable_elements(python, workdir, engine):
    code, want = READ_TYPES[engine]
    done = subprocess.run([str(python), "-c", code], cwd=workdir, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == want
