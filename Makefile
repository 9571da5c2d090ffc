# The two commands a new user needs are `make run` and `make test`; both build .venv first.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST := $(BIN)/python -m pytest

.PHONY: setup run test lint soak bench conformance sandbox airflow-test interop prism pool-up pool-down prism-test clean

$(STAMP): setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,postgres]'
	touch $(STAMP)

# The project's own bytecode, written here: pip compiles what it installs but not an editable
# install's sources, and where PYTHONDONTWRITEBYTECODE is set (as on our CI machines) every process
# compiled them again, ~0.1 s of each start. Python ignores a file that is stale.
setup: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 pipeline transforms service embedpipe

# Sandbox + sample corpus + pipeline + summary + a nearest-neighbour query, all offline.
run: setup
	$(BIN)/python -m pipeline demo --workdir demo

# The quick suite: everything except the soak, the benchmarks and the Airflow and interop venv tests.
# Two pytest processes: most tests wait on a sandbox or a pipeline's subprocesses, so two share
# 2 cores well (6 minutes against 10 serially, measured on the same machine in one hour).
test: setup
	$(PYTEST) -q -n 2 -m "not soak and not bench and not airflow and not interop and not prism"

# Static checks: ruff (the rules in ruff.toml) and mypy (mypy.ini: strict where every function
# is annotated), with the versions the lint extra pins (installed again when setup.py changes).
LINT_STAMP := $(VENV)/.lint-stamp
$(LINT_STAMP): $(STAMP) setup.py
	$(BIN)/python -m pip install -q -e '.[lint]'
	touch $(LINT_STAMP)

lint: setup $(LINT_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

soak: setup
	$(PYTEST) -q -m soak -s

# The library section compares with Beam's OpenAITextEmbeddings, which needs the bench extra (openai).
bench: setup
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python -m tests.bench.run_bench

# Against the sandbox by default; BASE_URL=https://.../v1 (with EMBEDDINGS_API_KEY set)
# checks a real deployment for drift from the sandbox.
conformance: setup
	BASE_URL=$(BASE_URL) $(PYTEST) -q tests/conformance -m "not soak"

SANDBOX_PORT ?= 8780
sandbox: setup
	$(BIN)/python -m service.sandbox --port $(SANDBOX_PORT) --db sandbox.db \
		--key $${EMBEDDINGS_API_KEY:-sk-sandbox-demo} --balance 1000

airflow-test: setup
	$(PYTEST) -q -m airflow -s

# A real run's outputs queried in DuckDB, Polars, ClickHouse (chdb) and pyarrow/numpy, with the
# recipes of docs/outputs.md ("Reading the vectors"); the engines live in .venv-interop (~1 GB, built on first use).
interop: setup
	$(PYTEST) -q -m interop -s

# Beam's Prism runner (Go) of the installed apache-beam, built once from the Go module proxy into
# .cache/prism/ (needs Go; ~3 min and 66 MB): what --profile prism and prism-pool run on.
prism: setup
	$(BIN)/python -m tools.prism install

# A Beam worker pool on this .venv (EXTERNAL workers, as beside a Flink TaskManager), its pid in
# .pool/pids.json, on localhost (POOL_HOST). It holds no API key: each job's worker gets its
# launcher's. pool-down stops every recorded pool, or with POOL_PORT=N only the one on N.
POOL_PORT ?= 50000
pool-up: setup
	POOL_PORT=$(POOL_PORT) $(BIN)/python -m tools.pool up

pool-down:
	$(BIN)/python -m tools.pool down

# The tests marked prism: each command on Prism (LOOPBACK, and EXTERNAL workers of pools it starts
# on free ports) against the local runner; faults across processes. Builds Prism when missing.
prism-test: prism
	$(PYTEST) -q -n 2 -m "prism and not soak"

# What setup, the tests and make prism made (Prism's build in .cache/prism/), and the worker
# pool's state (.pool/): refused while a pool recorded there runs on the .venv this removes.
clean:
	$(PYTHON) -m tools.pool stopped
	rm -rf $(VENV) demo build dist *.egg-info .pytest_cache .hypothesis .mypy_cache .ruff_cache .cache/prism .pool
