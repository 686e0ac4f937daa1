# The two commands a user needs: `make demo` and `make test`. Both run `make setup` first.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CDK := node_modules/.bin/cdk
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
PYTEST_ARGS ?=
DEMO_SECONDS ?= 120

.PHONY: setup system jars cli scanner demo test bench synth rehearse lint package clean

setup: system $(STAMP) jars cli scanner ## Install everything (idempotent; fast when done)

system:
	@scripts/setup-system.sh

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[local,infra,dev]'
	@touch $@

jars: $(STAMP)
	@scripts/build_iceberg_jars.sh $(VENV)

# checkov (second IaC scanner, tests/infra/test_infra_checkov.py) pins libraries the project's own
# venv also uses: it gets a venv of its own.
CHECKOV_STAMP := .tools/checkov/.installed
scanner: $(CHECKOV_STAMP)
$(CHECKOV_STAMP): scripts/checkov-requirements.txt
	@test -x .tools/checkov/bin/python || python3 -m venv .tools/checkov
	.tools/checkov/bin/pip install -q --upgrade pip
	.tools/checkov/bin/pip install -q -r scripts/checkov-requirements.txt
	@touch $@

cli: $(CDK)
$(CDK): package.json
	npm install --no-audit --no-fund --loglevel=error
	@touch $@

demo: setup ## Run the pipeline end to end on the embedded local stack
	$(VENV)/bin/lakehouse demo --seconds $(DEMO_SECONDS)

test: setup ## Run the whole test suite (starts its own stack on other ports)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup ## Benchmarks; prints tables and writes bench/results/*.json
	$(PY) -m bench

package: setup ## Build the EMR artifact set (jobs + pinned manylinux deps) into dist/emr/<version>
	$(PY) -m lakehouse.emr_package

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

lint: setup
	$(VENV)/bin/ruff check lakehouse jobs infra tests bench app.py

clean:
	rm -rf cdk.out .pytest_cache
