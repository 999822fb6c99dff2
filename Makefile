# One venv, made and kept up to date by the targets that need it.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
TOOLS  := .tools
STAMP  := $(VENV)/.installed

export PATH := $(CURDIR)/$(TOOLS)/bin:$(PATH)

.PHONY: help demo test lint typecheck unit integration chart-test tools crds docs docs-build bench e2e e2e-node e2e-kind clean

help:
	@echo "make demo   - offline demo: emulated Kubernetes API + scripted model + the real operator"
	@echo "make test   - everything CI runs: lint, types, import contracts, unit, integration, chart, bench smoke"
	@echo "make unit   - the unit tests (tests/unit; K=path::test for some)"
	@echo "make integration - the integration scenarios against the emulator, then the secret-leak scan (K=path::test)"
	@echo "make bench  - benchmark harness; prints a table and writes bench/RESULTS.md"
	@echo "make crds   - regenerate crds/ and the chart's copy from the pydantic models"
	@echo "make docs   - regenerate the field reference and build the documentation site into site/"
	@echo "make e2e    - the integration scenarios against the cluster KUBECONFIG points at (K=path::test for one)"
	@echo "make e2e-node - the chart's operator in pods on a real node: builds the image, helm install, runs (docs/testing.md)"
	@echo "make e2e-kind - make e2e plus the chart and the examples on a throwaway kind cluster (Docker)"

# The groups install the stand-ins (sandbox/: emulator, fake Messages API, demo) from their folder; they are
# then reinstalled editable, so changes to them need no reinstall.
EDITABLE_SANDBOX := $(BIN)/python -m pip install --quiet --no-deps -e ./sandbox

$(STAMP): pyproject.toml sandbox/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=25.1"
	$(BIN)/python -m pip install --quiet -e . --group dev
	$(EDITABLE_SANDBOX)
	touch $@

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/agentrun-sandbox demo

tools:
	bash scripts/install-tools.sh $(TOOLS)

lint: $(STAMP)
	$(BIN)/ruff check operator sandbox tests bench
	$(BIN)/ruff format --check operator sandbox tests bench
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The tests run in parallel (pytest-xdist): WORKERS processes, for tests that mostly wait on operators,
# API servers and timers (docs/testing.md#parallel-runs). --dist loadfile keeps each file's tests on one
# worker, one after another (tests/conftest.py adds the groups of files that share one: the loads).
# With K= (a few tests) one process: starting four workers would take longer than the tests.
WORKERS ?= $(if $(K),0,4)
PYTEST  := $(BIN)/python -m pytest
SCAN    := tests/test_secrets_never_leak.py::test_no_secret_appears_in_anything_the_operators_left_behind

# $(call with-leak-scan,PYTEST ARGS): a parallel run, then the secret-leak scan over what every operator
# of every worker left (its own folder, removed afterwards). Both run; either failing fails the target
# (pytest's exit 5, no test run, included).
define with-leak-scan
evidence=$$(mktemp -d) && trap 'rm -rf "$$evidence"' EXIT && status=0 && \
{ $(PYTEST) -n $(WORKERS) --dist loadfile --leak-evidence="$$evidence" $(1) || status=$$?; } && \
{ $(PYTEST) --leak-evidence="$$evidence" $(SCAN) || status=$$?; } && \
exit $$status
endef

test: $(STAMP) $(VENV)/.bench-installed tools lint typecheck docs-build
	$(call with-leak-scan,)

unit: $(STAMP)
	$(PYTEST) -n $(WORKERS) --dist loadfile $(or $(K),tests/unit)

integration: $(STAMP) tools
	$(call with-leak-scan,$(or $(K),tests/integration))

chart-test: $(STAMP) tools
	$(PYTEST) tests/chart

crds: $(STAMP)
	$(BIN)/agentrun crd > crds/agentruns.agentrun.dev.yaml
	cp crds/agentruns.agentrun.dev.yaml charts/agentrun-operator/crds/agentruns.agentrun.dev.yaml
	$(BIN)/agentrun crd --reference > docs/reference/agentrun.md
	$(BIN)/agentrun crd --kind AgentRunQuota > crds/agentrunquotas.agentrun.dev.yaml
	cp crds/agentrunquotas.agentrun.dev.yaml charts/agentrun-operator/crds/agentrunquotas.agentrun.dev.yaml
	$(BIN)/agentrun crd --kind AgentRunQuota --reference > docs/reference/agentrunquota.md
	$(BIN)/agentrun crd --kind Agent > crds/agents.agentrun.dev.yaml
	cp crds/agents.agentrun.dev.yaml charts/agentrun-operator/crds/agents.agentrun.dev.yaml
	$(BIN)/agentrun crd --kind Agent --reference > docs/reference/agent.md
	$(BIN)/agentrun crd --kind AgentSchedule > crds/agentschedules.agentrun.dev.yaml
	cp crds/agentschedules.agentrun.dev.yaml charts/agentrun-operator/crds/agentschedules.agentrun.dev.yaml
	$(BIN)/agentrun crd --kind AgentSchedule --reference > docs/reference/agentschedule.md
	$(BIN)/agentrun crd --kind SandboxTemplate > crds/sandboxtemplates.agentrun.dev.yaml
	cp crds/sandboxtemplates.agentrun.dev.yaml charts/agentrun-operator/crds/sandboxtemplates.agentrun.dev.yaml
	$(BIN)/agentrun crd --kind SandboxTemplate --reference > docs/reference/sandboxtemplate.md

# Material for MkDocs prints an end-of-life notice (fixes until May 2027) on every build; silenced here.
# Without -q: MkDocs' quiet mode drops the warnings that --strict turns into a failed build.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs

$(VENV)/.docs-installed: $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet --group docs
	touch $@

docs: $(VENV)/.docs-installed
	$(BIN)/agentrun crd --reference > docs/reference/agentrun.md
	$(BIN)/agentrun crd --kind AgentRunQuota --reference > docs/reference/agentrunquota.md
	$(BIN)/agentrun crd --kind Agent --reference > docs/reference/agent.md
	$(BIN)/agentrun crd --kind AgentSchedule --reference > docs/reference/agentschedule.md
	$(BIN)/agentrun crd --kind SandboxTemplate --reference > docs/reference/sandboxtemplate.md
	$(MKDOCS) build --strict

# What make test checks: the site builds with no warning (links, anchors, nav); the reference is
# not regenerated here, so a stale one fails the unit test that compares it.
docs-build: $(VENV)/.docs-installed
	$(MKDOCS) build --strict

$(VENV)/.bench-installed: $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet --group bench
	$(EDITABLE_SANDBOX)
	touch $@

# BENCH_ARGS="--quick" or "--only loop" for a partial run (see python -m bench --help).
# BENCH_KUBECONFIG=PATH adds issue #32's figures on that real API server, merged into bench/RESULTS.md:
# 1000 runs on 1 and 4 replicas, transcripts in Secrets and in PostgreSQL (about 15 minutes more).
BENCH_REAL = --only scale,replicas --kubeconfig $(BENCH_KUBECONFIG) --scale-sizes 1000 --scale-repeats 1 \
	--replica-counts 1,4 --replica-repeats 1 --merge
bench: $(VENV)/.bench-installed
	$(BIN)/python -m bench $(BENCH_ARGS)
	@if [ -n "$(BENCH_KUBECONFIG)" ]; then \
	  $(BIN)/python -m bench $(BENCH_REAL) --transcript-store secret && \
	  $(BIN)/python -m bench $(BENCH_REAL) --transcript-store postgres; \
	fi

# One scenario at a time: some install cluster-wide objects (the CRDs, admission policies, the chart's
# ClusterRoles) that two scenarios at once would share. K=path::test runs one scenario.
e2e: $(STAMP) tools
	$(PYTEST) --real-cluster $(or $(K),tests/integration)

# The node tier: the images built from the Dockerfile and images/sandbox/Dockerfile and imported into the
# real node (REAL_NODE_TOOLS: the real-node recipe's folder; E2E_BUILD=0 uses an E2E_IMAGE and an
# E2E_SANDBOX_IMAGE already on the node), then tests/node with the chart's operator in pods.
# K=path::test runs one scenario.
REAL_NODE_TOOLS ?= ../shared/tools/real-node
REAL_APISERVER_HOME ?= $(HOME)/.real-apiserver
E2E_IMAGE ?= localhost/agentrun-operator:dev
E2E_SANDBOX_IMAGE ?= localhost/agentrun-sandbox:dev
E2E_BUILD ?= 1
e2e-node: $(STAMP) tools
	@if [ "$(E2E_BUILD)" = 1 ]; then \
	  test -x $(REAL_NODE_TOOLS)/image.sh || { echo "e2e-node: no $(REAL_NODE_TOOLS)/image.sh to build the image with; set REAL_NODE_TOOLS, or E2E_BUILD=0 with E2E_IMAGE on the node" >&2; exit 2; }; \
	  bash $(REAL_NODE_TOOLS)/image.sh $(CURDIR) $(E2E_IMAGE); \
	  bash scripts/sandbox-image.sh $(REAL_NODE_TOOLS) $(E2E_SANDBOX_IMAGE); \
	fi
	AGENTRUN_E2E_IMAGE=$(E2E_IMAGE) AGENTRUN_E2E_SANDBOX_IMAGE=$(E2E_SANDBOX_IMAGE) \
	AGENTRUN_E2E_REAL_NODE_TOOLS=$(REAL_NODE_TOOLS) \
	AGENTRUN_E2E_CONTROLLER_MANAGER=$$(test -x $(REAL_APISERVER_HOME)/bin/kube-controller-manager && echo $(REAL_APISERVER_HOME)/bin/kube-controller-manager) \
	$(BIN)/python -m pytest --real-node -s $(or $(K),tests/node)

e2e-kind: $(STAMP)
	bash scripts/e2e-kind.sh

clean:
	rm -rf $(VENV) $(TOOLS) build dist site .mypy_cache .ruff_cache
