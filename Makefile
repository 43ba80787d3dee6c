# The usual verbs. `make run` and `make test` are the README's two commands: each creates
# the venv and installs what it needs first (torch pinned to the CPU build before the rest).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PIP    := $(BIN)/python -m pip
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install run test test-fast lint format typecheck bench serve loadtest compose-check clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements/constraints.txt
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

serve: $(STAMP)
	$(BIN)/ctx serve

loadtest: $(STAMP)
	$(BIN)/ctx loadtest $(or $(PROFILE),short_sessions)

compose-check:  ## validate docker-compose.yml (throwaway secrets: the real ones come from your env)
	POSTGRES_PASSWORD=$${POSTGRES_PASSWORD:-check-only} AIRFLOW_JWT_SECRET=$${AIRFLOW_JWT_SECRET:-check-only} \
	  docker-compose -f docker-compose.yml config --quiet && echo "docker-compose.yml is valid"

clean:
	rm -rf .ctx airflow_home .pytest_cache .mypy_cache .ruff_cache
