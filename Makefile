# The usual verbs. `make run` and `make test` are the README's two commands: each creates
# the venv and installs what it needs first (torch pinned to the CPU build before the rest).
# The venv's interpreter: the first CPython 3.11 or 3.12 with venv and ensurepip whose `re`
# module passes the redaction patterns' self-test, the distribution's own first: distributions
# build CPython with profile-guided and link-time optimisation, a plain source build (pyenv's
# default) has neither, and here it cost about a quarter more CPU per service request (README,
# "The interpreter"). PYTHON=... overrides.
PY_OK  := import sys, venv, ensurepip, runpy; (3, 11) <= sys.version_info[:2] < (3, 13) or sys.exit(1); runpy.run_path("context_core/gateway/patterns.py")
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell for p in /usr/bin/python3.11 /usr/bin/python3.12 python3.11 python3.12 python3; do \
  command -v $$p >/dev/null 2>&1 && $$p -c '$(PY_OK)' 2>/dev/null && { command -v $$p; break; }; done)
endif
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PIP    := $(BIN)/python -m pip
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install run test test-fast lint format typecheck bench serve loadtest compose-check docs clean proto

install: $(STAMP)

$(STAMP): pyproject.toml requirements/constraints.txt
	@test -n "$(PYTHON)" || { echo 'no CPython 3.11 or 3.12 with venv (and a re module that passes context_core/gateway/patterns.py) found: install one, or make PYTHON=/path/to/python3.11'; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "torch==2.13.0"
	$(PIP) install --quiet -c requirements/constraints.txt -e ".[dev]"
	touch $(STAMP)

run: $(STAMP)  ## main job: refresh the sample export, calibrate, write the reports
	$(BIN)/ctx run

test: $(STAMP)  ## the whole suite on real servers (Redis 7 on :6379 if up, else embedded Valkey)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/ruff check dags --select AIR
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)  ## benchmarks/*: prints tables and writes reports/benchmarks.md
	$(BIN)/python -m benchmarks

proto: $(STAMP)  ## regenerate the gRPC stubs in context_app/rpc/v1 from context.proto
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. context_app/rpc/v1/context.proto

serve: $(STAMP)
	$(BIN)/ctx serve

loadtest: $(STAMP)
	$(BIN)/ctx loadtest $(or $(PROFILE),short_sessions)

docs: $(STAMP)  ## the documentation site (mkdocs.yml, docs/) into site/; --strict: a warning fails
	$(BIN)/mkdocs build --strict --site-dir site

compose-check:  ## validate docker-compose.yml (throwaway secrets: the real ones come from your env)
	POSTGRES_PASSWORD=$${POSTGRES_PASSWORD:-check-only} AIRFLOW_JWT_SECRET=$${AIRFLOW_JWT_SECRET:-check-only} \
	  PG_CTX_OWNER_PASSWORD=$${PG_CTX_OWNER_PASSWORD:-check-only} PG_CTX_APP_PASSWORD=$${PG_CTX_APP_PASSWORD:-check-only} \
	  docker-compose -f docker-compose.yml config --quiet && echo "docker-compose.yml is valid"

clean:
	rm -rf .ctx airflow_home .pytest_cache .mypy_cache .ruff_cache
