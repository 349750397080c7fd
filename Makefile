# cifar10-pipeline: every command a user runs. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUTPUT ?= outputs
SOURCE ?= synthetic

.PHONY: help install constraints test lint format prepare-data bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 20

install:  ## create .venv and install the pinned dependencies and this project
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade "pip>=24"
	$(BIN)/pip install --quiet -r requirements-dev.txt -c constraints.txt
	$(BIN)/pip install --quiet --no-deps -e .

constraints:  ## re-pin every installed package into constraints.txt (after changing requirements*.txt)
	rm -rf .venv-pin && $(PYTHON) -m venv .venv-pin && .venv-pin/bin/pip install --quiet -r requirements-dev.txt
	(echo "# Every package installed by 'make install', pinned (pip freeze of a clean .venv). Regenerate with 'make constraints'."; \
	  .venv-pin/bin/pip freeze) > constraints.txt && rm -rf .venv-pin

test:  ## run the whole test suite
	$(BIN)/python -m pytest -q

lint:  ## ruff check and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format:  ## apply ruff fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

prepare-data:  ## run the prepare_data stage alone: make prepare-data SOURCE=... OUTPUT=...
	$(BIN)/python -m components.prepare_data --source $(SOURCE) --output $(OUTPUT)/dataset

bench:  ## run every benchmark (needs ../shared/data)
	$(BIN)/python bench/prepare_data.py

clean:  ## remove outputs and caches (not .venv)
	rm -rf $(OUTPUT) .pytest_cache .ruff_cache bench/work
