# llmfleet: the two entry points are `make sandbox` and `make test`.
# Both install what is missing (apt packages, the Python environment, the
# control-plane binaries built from pinned Go modules) and reuse caches.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_OPTS ?=

.PHONY: sandbox test unit e2e down setup apt-packages python-env controlplane crds bench help

help:
	@echo "make sandbox   install what is missing, start the sandbox, the operator and a demo"
	@echo "make test      install what is missing, run unit and e2e tests"
	@echo "make down      stop the sandbox"
	@echo "make crds      regenerate crds/, the chart copy and docs/api.md from the API models, and the"
	@echo "               chart's Prometheus rules and Grafana dashboard"
	@echo "make bench     run the benchmarks and write docs/benchmarks.md"

setup: apt-packages python-env controlplane

apt-packages:
	@missing=""; \
	command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	test -x /usr/bin/aws || missing="$$missing awscli"; \
	command -v nsenter >/dev/null || missing="$$missing util-linux"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	command -v nft >/dev/null || missing="$$missing nftables"; \
	dpkg -s libjemalloc2 >/dev/null 2>&1 || missing="$$missing libjemalloc2"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@# The path the chart preloads jemalloc from, as the image links it (host operators in e2e and bench).
	@test -e /usr/local/lib/libjemalloc.so.2 || \
	  $(SUDO) ln -s "$$(dpkg -L libjemalloc2 | grep '/libjemalloc.so.2$$')" /usr/local/lib/libjemalloc.so.2

python-env: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,sandbox]'
	@touch $@

# Everything `sandbox up` builds or copies from Go modules, once, before sandboxes start side by side.
controlplane:
	@operator/controlplane/build.sh >/dev/null
	@operator/controlplane/lws.sh >/dev/null
	@operator/controlplane/gateway-crds.sh >/dev/null

sandbox: setup
	$(SUDO) $(BIN)/llmfleet sandbox up
	$(SUDO) $(BIN)/llmfleet sandbox demo

down: python-env
	$(SUDO) $(BIN)/llmfleet sandbox down

test: setup unit e2e

# Test tiers are pytest markers (pyproject.toml): `unit` and `integration` (a real Triton or
# Prometheus process, no cluster) run here, `e2e` (the sandbox) below; PYTEST_OPTS='-m unit'
# picks the quick tier alone. pytest exits 5 when it collects nothing; that is not a failure here.
# The unit tier runs on UNIT_WORKERS pytest-xdist workers (three on two cores: its tests wait on
# real Triton and Prometheus processes; 2:19 against 3:13 with two, 2026-12-08), the e2e tier on
# TEST_WORKERS (0: in one process). The e2e workers take whole modules, in the order
# e2e/conftest.py gives them (long ones first, teardown last), each with a sandbox and an
# operator of its own. Two on two cores: a third took the suite
# from 38 to 27 minutes (2026-12-07), but once serving pods finished their streams before stopping
# and a second four-node test came, a run of three took 35 minutes and four timing-sensitive tests
# (new replicas ready later, p99 just over its bound) failed, two of them again when rerun beside
# each other, and one passed alone. TEST_WORKERS=3 is quicker on a quieter or larger machine.
TEST_WORKERS ?= 2
UNIT_WORKERS ?= 3

unit: python-env
	$(BIN)/ruff check operator e2e benchmarks
	@$(BIN)/pytest operator/tests -q -n $(UNIT_WORKERS) $(PYTEST_OPTS) || [ $$? -eq 5 ]

e2e: setup
	@$(BIN)/pytest e2e -q --durations=30 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  $(PYTEST_OPTS) || [ $$? -eq 5 ]

crds: python-env
	$(BIN)/python -m llmfleet.api.crdgen
	$(BIN)/python -m llmfleet.render.monitoring

bench: setup
	$(BIN)/python benchmarks/run_all.py
