# SlimPack suite. Every target sets itself up: a fresh clone needs only `make test` or
# `make reproduce`. CPU installs pin the CPU build of torch 2.13.0 through
# constraints-cpu.txt (a loose torch pin pulls a multi-GB CUDA build); `make install GPU=1`
# installs the CUDA stack and the gpu extra (flash-attn, megatron-core) instead.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
GPU ?=
JOBS ?= 2

ifeq ($(GPU),)
PIP_CONSTRAINT := -c constraints-cpu.txt
EXTRAS := dev
else
PIP_CONSTRAINT :=
EXTRAS := dev,gpu
endif

.PHONY: install test lint reproduce reproduce-quick reproduce-gpu report bench gpu-check clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints-cpu.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
ifeq ($(GPU),)
	$(PY) -m pip install -q $(PIP_CONSTRAINT) torch==2.13.0
endif
	$(PY) -m pip install -q $(PIP_CONSTRAINT) -e '.[$(EXTRAS)]'
	@touch $(STAMP)

lint: install
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports

test: install lint
	$(PY) -m pytest -q

# `make reproduce` recomputes every point into $(REPRO_DIR) (never reusing the committed
# records), compares them with results/ (per-experiment max relative difference, fails beyond
# RTOL; wall-clock columns aside), then draws the figures and REPORT.md there. An interrupted
# run resumes on the next `make reproduce`; a finished one (marked .complete) starts afresh.
REPRO_DIR ?= build/reproduce
REPRO_AGAINST ?= results
REPRO_REGISTRY ?= repro.registry
RTOL ?= 1e-3
REPRO := $(PY) -m repro

define fresh_run
	@if [ -f $(1)/.complete ]; then echo "$(1): previous run complete; starting afresh"; \
		rm -rf $(1); fi
	$(REPRO) run all --jobs $(JOBS) --results-dir $(1) --registry $(REPRO_REGISTRY) $(2) \
		$(REPRO_FLAGS)
	@touch $(1)/.complete
	status=0; $(REPRO) compare --results-dir $(1) --against $(REPRO_AGAINST) --rtol $(RTOL) \
		--registry $(REPRO_REGISTRY) || status=$$?; \
	$(REPRO) plot all --results-dir $(1) --registry $(REPRO_REGISTRY) \
		&& $(REPRO) report --results-dir $(1) --registry $(REPRO_REGISTRY) \
		&& echo "figures and REPORT.md in $(1)" && exit $$status
endef

reproduce: install
	$(call fresh_run,$(REPRO_DIR),)

reproduce-quick: install
	$(call fresh_run,$(REPRO_DIR)-quick,--quick)

reproduce-gpu: install
	$(PY) -m repro run all --backend runtime
	$(PY) -m repro plot all
	$(PY) -m repro report

report: install
	$(PY) -m repro report

bench: install
	mkdir -p results/bench
	$(PY) -m pytest -q tests/benchmarks --benchmark-enable --benchmark-only \
		--benchmark-storage=file://results/bench --benchmark-autosave \
		$(if $(wildcard results/bench/*/*.json),--benchmark-compare,)

gpu-check: install
	$(PY) -m slimpack.cli.gpu_check --out results/gpu

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
