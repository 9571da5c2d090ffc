# The two commands a new user needs are `make run` and `make test`; both build .venv first.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
UV     := $(BIN)/uv
STAMP  := $(VENV)/.installed-stamp
PYTEST := $(BIN)/python -m pytest

.PHONY: setup dev run test lint lock soak bench conformance sandbox airflow-test interop prism pool-up pool-down prism-test clean

# .venv holds exactly a lock file (tools/lock.py says which is which): uv's `pip sync` installs
# each package at its locked version, checks each file's sha256 against the lock, builds nothing
# from source, removes what the lock does not name, and writes the bytecode as pip would (uv does
# not by default); embedpipe goes on top, editable, built by the locked setuptools. tools.lock
# check then compares `pip list` with the lock, and the lock with setup.py. A changed lock or
# setup.py installs again.
SYNC   := $(UV) pip sync -q --python $(BIN)/python --require-hashes --no-build --compile-bytecode
EDITABLE := $(UV) pip install -q --python $(BIN)/python --no-deps --no-build-isolation -e .

# uv itself, pinned with its hashes, installed by the venv's own pip.
UV_STAMP := $(VENV)/.uv-stamp
$(UV_STAMP): requirements-uv.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --require-hashes --no-deps -r requirements-uv.lock
	touch $(UV_STAMP)

$(STAMP): $(UV_STAMP) requirements.lock setup.py
	$(SYNC) requirements.lock
	$(EDITABLE)
	$(BIN)/python -m tools.lock check requirements.lock
	touch $(STAMP)

# The project's own bytecode, written here: the install compiles what it installs but not an
# editable install's sources, and where PYTHONDONTWRITEBYTECODE is set (as on our CI machines) every process
# compiled them again, ~0.1 s of each start. Python ignores a file that is stale.
setup: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 pipeline transforms service embedpipe

# Sandbox + sample corpus + pipeline + summary + a nearest-neighbour query, all offline.
run: setup
	$(BIN)/python -m pipeline demo --workdir demo

# The quick suite: everything except the soak, the benchmarks and the Airflow and interop venv tests.
# Two pytest processes: most tests wait on a sandbox or a pipeline's subprocesses, so two share
# 2 cores well (9.3-10.1 minutes, ~80% of both cores busy: three would not be faster).
test: setup
	$(PYTEST) -q -n 2 -m "not soak and not bench and not airflow and not interop and not prism"

# Static checks: ruff (the rules in ruff.toml) and mypy (mypy.ini: strict where every function
# is annotated), at the versions of requirements-dev.lock (.venv is then exactly that lock: the
# setup's packages and the lint, bench and report extras, installed again when either lock changes).
DEV_STAMP := $(VENV)/.dev-stamp
$(DEV_STAMP): $(STAMP) requirements-dev.lock
	$(SYNC) requirements-dev.lock
	$(EDITABLE)
	$(BIN)/python -m tools.lock check requirements-dev.lock
	touch $(DEV_STAMP)

# The lint, bench and report extras (matplotlib: report.png) in .venv, at the lock's versions.
dev: setup $(DEV_STAMP)

lint: setup $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# The newest versions within setup.py's ranges (and tests/airflow's and tests/interop's), every
# lock file rewritten; then `make test` (README, Development). LOCK_PLATFORM=aarch64-apple-darwin
# (uv's --python-platform) resolves for another machine, for that machine only.
lock: $(UV_STAMP)
	$(BIN)/python -m tools.lock $(if $(LOCK_PLATFORM),--platform $(LOCK_PLATFORM))

soak: setup
	$(PYTEST) -q -m soak -s

# The library section compares with Beam's OpenAITextEmbeddings, which needs the bench extra (openai):
# .venv becomes requirements-dev.lock, as for make lint.
bench: setup $(DEV_STAMP)
	$(BIN)/python -m tests.bench.run_bench

# Against the sandbox by default; BASE_URL=https://.../v1 (with EMBEDDINGS_API_KEY set)
# checks a real deployment for drift from the sandbox.
conformance: setup
	BASE_URL=$(BASE_URL) $(PYTEST) -q tests/conformance -m "not soak"

SANDBOX_PORT ?= 8780
sandbox: setup
	$(BIN)/python -m service.sandbox --port $(SANDBOX_PORT) --db sandbox.db \
		--key $${EMBEDDINGS_API_KEY:-sk-sandbox-demo} --balance 1000

# Airflow in its own venv (.venv-airflow: exactly requirements-airflow.lock, built on first use).
airflow-test: setup
	$(PYTEST) -q -m airflow -s

# A real run's outputs queried in DuckDB, Polars, ClickHouse (chdb) and pyarrow/numpy, with the
# recipes of docs/outputs.md ("Reading the vectors"); the engines live in .venv-interop (exactly
# requirements-interop.lock; ~1 GB, built on first use).
interop: setup
	$(PYTEST) -q -m interop -s

# Beam's Prism runner (Go) of the installed apache-beam, built once into .cache/prism/ from the
# Go module proxy's source of that version with tools/prism-bind.patch (-job_host: it listens on
# 127.0.0.1, not on every interface); needs Go and git, ~3.5 min and 66 MB. A version the patch
# does not fit fails naming the file. What --profile prism and prism-pool run on.
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
