# cifar10-pipeline: every command a user runs. `make help` lists them.
# The repository's folder, so that `make -f path/to/Makefile` works from any folder (as `make -C path/to` does).
ROOT := $(dir $(abspath $(lastword $(MAKEFILE_LIST))))
PYTHON ?= python3
VENV ?= $(ROOT).venv
BIN := $(VENV)/bin
OUTPUT ?= outputs
SOURCE ?= synthetic
# make local-run: a quick demo by default (synthetic data, 2 local workers, a few hundred steps); for real CIFAR-10
# give SOURCE=https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz (or a local copy) and EPOCHS=...
RUNNER ?= subprocess
WORKERS ?= 2
DEPTH ?=
BATCH_SIZE ?= 128
TRAIN_STEPS ?=
EPOCHS ?=
THRESHOLD ?= 0.5
TRAIN_OPTIONS ?=
# PRESET: fast (airbench94_muon), airbench94, airbench94_muon or estimator (the CIFAR-10 estimator example's ResNet recipe)
PRESET ?=
# DATA_CHECK: warn, block or fail (the data check against the promoted model's data; a schedule blocks by default);
# LEAKAGE: keep, drop_from_train or drop_from_eval (test images with a near-duplicate in training)
DATA_CHECK ?=
LEAKAGE ?=
# make sweep: SPACE, the search space (a JSON or YAML file of train settings to ranges or choices); TRIALS, its budget
SPACE ?= $(ROOT)pipeline/sweep_space.yaml
TRIALS ?=
# MODEL_REGISTRY: Kubeflow's Model Registry (http(s)://HOST[:PORT]) each promoted version is registered in
MODEL_REGISTRY ?=
# make predict: the model (a promotion root, a version folder or a SavedModel), the images, the JSON Lines written
MODEL ?= $(OUTPUT)/models
IMAGES ?=
PREDICTIONS ?= $(OUTPUT)/predictions.jsonl
EXTRA ?=
# make local-run: RESUME=<run folder or name, or last> continues that run's training; VERBOSE=1 shows every line
RESUME ?=
VERBOSE ?=
KFP_HOST ?=
# make run / schedule on a multi-user Kubeflow: NAMESPACE (or KFP_NAMESPACE) is your profile's; credentials come from
# KF_PIPELINES_SA_TOKEN_PATH (a token file), KFP_TOKEN or KFP_COOKIE; KFP_CA_BUNDLE for a private TLS endpoint.
NAMESPACE ?=
# make run WAIT=1: follow the run to its end; the exit code says how it ended.
WAIT ?=
EXPERIMENT ?= cifar10
CRON ?= 0 0 3 * * *
PROMOTION_ROOT ?=
LOGDIR ?= $(OUTPUT)
REGISTRY ?= ghcr.io/cifar10-pipeline
# TAG empty: derived from the images' content (components/images.py), so new code never hits KFP's cache of old.
TAG ?=
# make images: ENGINE docker or podman (empty: whichever answers); BASE_IMAGE (empty: the Dockerfile's pinned one);
# CA_BUNDLE for networks that re-sign TLS (a build secret); STAND_IN_BASE=1 builds the base from Debian packages.
ENGINE ?=
BASE_IMAGE ?=
CA_BUNDLE ?=
STAND_IN_BASE ?=
# The images (images/Dockerfile: cpu and gpu) follow REGISTRY and TAG, and so do the components' references.
export CIFAR10_PIPELINE_REGISTRY := $(REGISTRY)
export CIFAR10_PIPELINE_TAG := $(TAG)
PIPELINE := $(BIN)/python -m pipeline.pipeline
# clean-runs: KEEP, ALL; serving-ops: VERSION; tensorboard: PORT.
KEEP ?=
ALL ?=
VERSION ?=
PORT ?=

# A variable given on the command line must be one of this Makefile's (a typo such as EPOCH=2 would otherwise be
# ignored and the demo would run), or a setting the programs read from the environment.
KNOWN_VARIABLES := ROOT PYTHON VENV BIN OUTPUT SOURCE RUNNER WORKERS DEPTH BATCH_SIZE TRAIN_STEPS EPOCHS THRESHOLD \
	TRAIN_OPTIONS PRESET DATA_CHECK LEAKAGE MODEL_REGISTRY SPACE TRIALS EXTRA RESUME VERBOSE KFP_HOST NAMESPACE WAIT EXPERIMENT CRON PROMOTION_ROOT LOGDIR REGISTRY \
	TAG ENGINE BASE_IMAGE CA_BUNDLE STAND_IN_BASE KEEP ALL VERSION PORT MODEL IMAGES PREDICTIONS
ENVIRONMENT_SETTINGS := KFP_% KF_% AWS_% GOOGLE_% CIFAR10_PIPELINE_% CONTAINERS_% BUILDAH_% DOCKER_% \
	STORAGE_EMULATOR_HOST HOME TMPDIR XDG_%
GIVEN_VARIABLES := $(foreach name,$(.VARIABLES),$(if $(filter command line,$(origin $(name))),$(name)))
UNKNOWN_VARIABLES := $(filter-out $(KNOWN_VARIABLES) $(ENVIRONMENT_SETTINGS),$(GIVEN_VARIABLES))
ifneq ($(UNKNOWN_VARIABLES),)
$(error $(UNKNOWN_VARIABLES): not a variable of this Makefile (its variables: $(KNOWN_VARIABLES)))
endif
# Only what is given is passed on (PRESET, EPOCHS or TRAIN_STEPS, TRAIN_OPTIONS); EXTRA comes last and so wins.
RUN_PARAMETERS = --source "$(SOURCE)" --workers $(WORKERS) $(if $(DEPTH),--depth $(DEPTH)) --batch-size $(BATCH_SIZE) \
	--accuracy-threshold $(THRESHOLD) $(if $(PRESET),--preset $(PRESET)) \
	$(if $(TRAIN_STEPS),--train-steps $(TRAIN_STEPS)) $(if $(EPOCHS),--epochs $(EPOCHS)) \
	$(if $(TRAIN_OPTIONS),--train-options '$(TRAIN_OPTIONS)') $(if $(DATA_CHECK),--data-check $(DATA_CHECK)) \
	$(if $(LEAKAGE),--leakage $(LEAKAGE)) $(if $(MODEL_REGISTRY),--model-registry $(MODEL_REGISTRY))
# make local-run is a quick demo unless told otherwise (by a length, options or a PRESET, whose recipe then holds):
# 300 steps of a ResNet-8 (unless DEPTH is given), and a batch-norm decay of 0.9 (the estimator example's 0.997 needs
# thousands of steps before its moving averages are usable).
DEMO = $(if $(PRESET),,$(if $(TRAIN_STEPS)$(EPOCHS),,--train-steps 300 $(if $(DEPTH),,--depth 8)) \
	$(if $(TRAIN_OPTIONS),,--train-options '{"batch_norm_decay": 0.9}'))

# make local-run RESUME=...: the run goes on with its own options (recorded in its folder); only a new length may be
# given (TRAIN_STEPS or EPOCHS), or other options in EXTRA, which must agree with the run's.
RESUMED = --resume $(RESUME) $(if $(TRAIN_STEPS),--train-steps $(TRAIN_STEPS)) $(if $(EPOCHS),--epochs $(EPOCHS))

.PHONY: help install constraints test test-images lint format local-run sweep compile run schedule tensorboard images push
.PHONY: prepare-data predict bench bench-sweep bench-accuracy serving-ops clean clean-runs

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 20

install:  ## create .venv and install the pinned dependencies and this project
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade "pip>=24"
	$(BIN)/pip install --quiet -r $(ROOT)requirements-dev.txt -c $(ROOT)constraints.txt
	$(BIN)/pip install --quiet --no-deps -e $(ROOT)

constraints:  ## re-pin every installed package into constraints.txt (after changing requirements*.txt)
	cd $(ROOT) && rm -rf .venv-pin && $(PYTHON) -m venv .venv-pin && .venv-pin/bin/pip install --quiet -r requirements-dev.txt
	cd $(ROOT) && (echo "# Every package installed by 'make install', pinned (pip freeze of a clean .venv). Regenerate with 'make constraints'."; \
	  .venv-pin/bin/pip freeze) > constraints.txt && rm -rf .venv-pin

test:  ## run the whole test suite (but the container images': make test-images)
	cd $(ROOT) && $(BIN)/python -m pytest -q

test-images:  ## build the images and run the pipeline in them (podman or Docker; about 25 minutes, see docs/containers.md)
	cd $(ROOT) && $(BIN)/python -m pytest -q -s -m images -p no:cacheprovider tests/test_images.py

lint:  ## ruff check and format check; deptry: every module the code imports is a declared dependency
	cd $(ROOT) && $(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/deptry .

format:  ## apply ruff fixes and formatting
	cd $(ROOT) && $(BIN)/ruff check --fix . && $(BIN)/ruff format .

local-run:  ## the whole pipeline on this machine: make local-run [SOURCE=... EPOCHS=... RESUME=last VERBOSE=1 RUNNER=docker]
	$(PIPELINE) local-run --runner $(RUNNER) --output-root $(OUTPUT) $(if $(RESUME),$(RESUMED),$(RUN_PARAMETERS) $(DEMO)) \
	  $(if $(VERBOSE),--verbose) $(EXTRA)

sweep:  ## search the train settings, then train, evaluate and promote the best: make sweep [SPACE=file TRIALS=8 ...]
	$(PIPELINE) sweep local-run --runner $(RUNNER) --output-root $(OUTPUT) $(RUN_PARAMETERS) $(DEMO) \
	  --space $(SPACE) --trials $(or $(TRIALS),$(if $(PRESET)$(TRAIN_STEPS)$(EPOCHS),12,4)) $(if $(VERBOSE),--verbose) $(EXTRA)

clean-runs:  ## remove finished runs' folders (interrupted ones too with ALL=1); promoted models stay: [KEEP=1 ALL=1]
	$(PIPELINE) clean-runs --output-root $(OUTPUT) --keep $(or $(KEEP),0) $(if $(ALL),--all)

compile:  ## write pipeline/pipeline.yaml (and predict.yaml, the batch prediction pipeline; sweep.yaml, the search)
	$(PIPELINE) compile
	$(BIN)/python -m pipeline.predict_pipeline compile
	$(PIPELINE) sweep compile

run:  ## compile and submit a run to $$KFP_HOST: make run KFP_HOST=... NAMESPACE=... SOURCE=s3://... [WAIT=1]
	$(PIPELINE) run --host "$(KFP_HOST)" --experiment $(EXPERIMENT) $(if $(NAMESPACE),--namespace $(NAMESPACE)) \
	  $(if $(WAIT),--wait) $(RUN_PARAMETERS) $(if $(PROMOTION_ROOT),--promotion-root $(PROMOTION_ROOT)) $(EXTRA)

schedule:  ## recurring retraining: make schedule KFP_HOST=... CRON='0 0 3 * * *' PROMOTION_ROOT=gs://...
	$(PIPELINE) schedule --host "$(KFP_HOST)" --cron "$(CRON)" --experiment $(EXPERIMENT) \
	  $(if $(NAMESPACE),--namespace $(NAMESPACE)) $(RUN_PARAMETERS) \
	  --promotion-root "$(PROMOTION_ROOT)" $(EXTRA)

tensorboard:  ## TensorBoard on a run's logs: make tensorboard LOGDIR=outputs/cifar10-pipeline-.../... [PORT=6006] (or gs://, s3://)
	$(PIPELINE) tensorboard --logdir "$(LOGDIR)" $(if $(PORT),--port $(PORT))

images:  ## build the cpu and gpu images with Docker or podman: make images [REGISTRY=... TAG=... CA_BUNDLE=...]
	$(BIN)/python -m images.build $(if $(ENGINE),--engine $(ENGINE)) $(if $(BASE_IMAGE),--base-image $(BASE_IMAGE)) \
	  $(if $(CA_BUNDLE),--ca-bundle $(CA_BUNDLE)) $(if $(STAND_IN_BASE),--stand-in-base)

push:  ## build and push the images: make push REGISTRY=... (then make compile: the pipeline names what was pushed)
	$(BIN)/python -m images.build --push $(if $(ENGINE),--engine $(ENGINE)) \
	  $(if $(BASE_IMAGE),--base-image $(BASE_IMAGE)) $(if $(CA_BUNDLE),--ca-bundle $(CA_BUNDLE))

prepare-data:  ## run the prepare_data stage alone: make prepare-data SOURCE=... OUTPUT=...
	$(BIN)/python -m components.prepare_data --source $(SOURCE) --output $(OUTPUT)/dataset

predict:  ## score images with the promoted model: make predict IMAGES=folder-or-dataset [MODEL=... PREDICTIONS=...]
	$(if $(IMAGES),,$(error IMAGES: give the images to score (a folder, a prepared dataset, a gs:// or s3:// prefix)))
	$(BIN)/python -m components.predict --model $(MODEL) --images $(IMAGES) --output $(PREDICTIONS) $(EXTRA)

bench-sweep:  ## a sweep of 8 half-epoch trials around the fast recipe on real CIFAR-10 (about 15 minutes on 2 cores)
	$(BIN)/python $(ROOT)bench/sweep.py

bench:  ## run every benchmark (needs ../shared/data; bench/predict.py a promoted model: make local-run first)
	$(BIN)/python $(ROOT)bench/prepare_data.py
	$(BIN)/python $(ROOT)bench/near_duplicates.py
	$(BIN)/python $(ROOT)bench/train.py
	$(BIN)/python $(ROOT)bench/evaluate.py
	$(BIN)/python $(ROOT)bench/predict.py

bench-accuracy:  ## airbench94 against airbench94_muon on real CIFAR-10: 2 runs each at their own lengths (hours on 2 cores)
	$(BIN)/python $(ROOT)bench/accuracy.py

serving-ops:  ## op definitions of a TensorFlow Serving release, from its own package: make serving-ops VERSION=2.6.2
	$(BIN)/python -m components.evaluate.serving_ops.generate $(VERSION)

clean:  ## remove outputs (promoted models too) and caches (not .venv)
	rm -rf $(OUTPUT) .pytest_cache .ruff_cache bench/work
