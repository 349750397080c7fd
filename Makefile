# cifar10-pipeline: every command a user runs. `make help` lists them, with the variables each takes.
# Which variables a target takes, and the option each becomes, is one table: pipeline/make.py. A variable no chosen
# target takes (misspelt, or another target's) stops make before anything runs, naming the targets that take it.
# The repository's folder, so that `make -f path/to/Makefile` works from any folder (as `make -C path/to` does).
ROOT := $(dir $(abspath $(lastword $(MAKEFILE_LIST))))
PYTHON ?= python3
VENV ?= $(ROOT).venv
BIN := $(VENV)/bin
OUTPUT ?= outputs

GIVEN_VARIABLES := $(foreach name,$(.VARIABLES),$(if $(filter command line,$(origin $(name))),$(name)))
PROBLEM := $(shell $(PYTHON) $(ROOT)pipeline/make.py check $(or $(MAKECMDGOALS),help) -- $(GIVEN_VARIABLES))
ifneq ($(PROBLEM),)
$(error $(PROBLEM))
endif
# The targets that run the project's programs: the table builds each command (make -n shows it; the + lets the table
# answer -n itself). Without make, `.venv/bin/python -m pipeline.make TARGET NAME=value ...` keeps the exit code.
PROGRAMS := local-run sweep clean-runs compile run schedule schedules tensorboard images push prepare-data predict \
	serving-ops leases

.PHONY: help install constraints test test-images lint format clean bench bench-sweep bench-scale bench-accuracy \
	bench-reference-setup
.PHONY: $(PROGRAMS)

help:
	@$(PYTHON) $(ROOT)pipeline/make.py help

install:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade "pip>=24"
	$(BIN)/pip install --quiet -r $(ROOT)requirements-dev.txt -c $(ROOT)constraints.txt
	$(BIN)/pip install --quiet --no-deps -e $(ROOT)
	cd $(ROOT) && $(BIN)/python -m components.common.compiled_kernels

constraints:
	cd $(ROOT) && rm -rf .venv-pin && $(PYTHON) -m venv .venv-pin && .venv-pin/bin/pip install --quiet -r requirements-dev.txt
	cd $(ROOT) && (echo "# Every package installed by 'make install', pinned (pip freeze of a clean .venv). Regenerate with 'make constraints'."; \
	  .venv-pin/bin/pip freeze) > constraints.txt && rm -rf .venv-pin

test:
	cd $(ROOT) && $(BIN)/python -m pytest -q

test-images:
	cd $(ROOT) && $(BIN)/python -m pytest -q -s -n 0 -m images -p no:cacheprovider tests/test_images.py

lint:
	cd $(ROOT) && $(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/deptry . && $(BIN)/python tools/check_readers.py

format:
	cd $(ROOT) && $(BIN)/ruff check --fix . && $(BIN)/ruff format .

$(PROGRAMS):
	+@$(BIN)/python -m pipeline.make $@ --given "$(filter-out VENV PYTHON,$(GIVEN_VARIABLES))"

bench-sweep:
	$(BIN)/python $(ROOT)bench/sweep.py

bench-scale:
	$(BIN)/python $(ROOT)bench/scale.py

bench:
	$(BIN)/python $(ROOT)bench/prepare_data.py
	$(BIN)/python $(ROOT)bench/near_duplicates.py
	$(BIN)/python $(ROOT)bench/data_check.py
	$(BIN)/python $(ROOT)bench/train.py
	$(BIN)/python $(ROOT)bench/evaluate.py
	$(BIN)/python $(ROOT)bench/predict.py
	$(BIN)/python $(ROOT)bench/step_profile.py
	$(BIN)/python $(ROOT)bench/fused_layers.py
	$(BIN)/python $(ROOT)bench/convolutions.py
	$(BIN)/python $(ROOT)bench/batch_norm_gelu.py

bench-accuracy:
	$(BIN)/python $(ROOT)bench/accuracy.py

bench-reference-setup:
	$(PYTHON) -m venv $(ROOT)bench/work/reference-venv
	$(ROOT)bench/work/reference-venv/bin/pip install --quiet torch==2.13.0 numpy

clean:
	@$(PYTHON) $(ROOT)pipeline/make.py check-clean "$(OUTPUT)" "$(ROOT)"
	rm -rf "$(OUTPUT)" "$(ROOT).pytest_cache" "$(ROOT).ruff_cache" "$(ROOT)bench/work"
