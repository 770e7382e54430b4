# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch first and pinned: the CPU wheel lies on this machine's disk; an unpinned torch pulls a
# multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: demo test install install-test lint typecheck pytest bench validate readme clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.installed: $(PY) pyproject.toml
	$(PIP) install -q -e '.[hub]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[hub,yaml,torch,rl,torchao,plot,web,test]'
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

demo: install
	$(VENV)/bin/peakmem train gpt2-xl --precision mixed-fp16 --seq 1024

lint: install-test
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

typecheck: install-test
	$(VENV)/bin/mypy

pytest: install-test
	$(VENV)/bin/pytest -n auto --dist loadfile --durations=15

test: lint typecheck pytest

# The accuracy benchmarks read ../shared/validation (next to the checkout); without it they say so
# and skip.
bench: install-test
	$(PY) benchmarks/speed.py
	$(PY) benchmarks/cli_wall.py
	$(PY) benchmarks/accuracy.py
	$(PY) benchmarks/accuracy_infer.py
	$(PY) benchmarks/accuracy_finetune.py
	$(PY) benchmarks/step_time_published.py
	$(PY) benchmarks/parity.py --sample
	$(PY) benchmarks/cuda_graphs.py
	$(PY) benchmarks/safetensors_index.py

# The README's accuracy table: every measured case the project ships (published points in
# ../shared/validation, the CPU parity grid, GPU fixtures once they exist), against the band.
validate: install-test
	$(PY) benchmarks/validate.py

# The README's printed answers (`$ peakmem ...` blocks, results in the Python API's comments), rewritten
# from what peakmem prints now; tests/test_readme.py fails while they differ.
readme: install
	$(PY) benchmarks/readme_answers.py --write

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
