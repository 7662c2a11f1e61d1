# Servlane's developer entry points. The two a newcomer needs: `make run` and `make test`.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup run test lint unit e2e crds cluster-up cluster-down bench helm-test e2e-helm images

setup:  ## install everything (idempotent, cached)
	bash scripts/setup.sh

run:  ## install what serving needs, then serve the local example on http://127.0.0.1:8080/v1
	bash scripts/setup.sh serve
	$(VENV)/bin/servlane serve

test: setup lint  ## every test: unit, runtime, gateway, canary metrics, e2e on the local control plane
	$(PY) -m pytest -q -p no:cacheprovider

lint:  ## ruff, mypy strict, import-linter contracts (product and tests), CRDs in sync with the models, the docs site (strict)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/lint-imports .importlinter-tests
	$(VENV)/bin/servlane-gencrds --check crds charts/servlane/crds
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

unit:
	$(PY) -m pytest -q tests/unit

e2e:
	$(PY) -m pytest -q e2e

crds:  ## regenerate the CRDs from the pydantic models
	$(VENV)/bin/servlane-gencrds crds charts/servlane/crds

cluster-up:  ## a local control plane with KWOK GPU nodes; prints the KUBECONFIG export
	$(PY) -m localcluster up

cluster-down:
	$(PY) -m localcluster down

bench:
	$(PY) bench/scale_bench.py

helm-test:
	$(PY) -m pytest -q tests/helm

e2e-helm:
	$(PY) -m pytest -x -q e2e/test_helm.py

images:  ## build the runtime (cpu, cuda), operator and gateway images with docker; cached by content key
	bash scripts/build-images.sh all
