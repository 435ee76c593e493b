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

.PHONY: run test test-unit test-integration lint proto docs bench clean venv vision-env llama-env \
	clients-env

venv: $(STAMP)

# The image adapters' runtime environment (requirements-vision.txt says why it is separate).
VISION_VENV := .venv-vision
VISION_STAMP := $(VISION_VENV)/.installed

vision-env: $(VISION_STAMP)

$(VISION_STAMP): requirements-vision.txt libs/pyproject.toml services/worker/pyproject.toml
	test -x $(VISION_VENV)/bin/python || $(PYTHON) -m venv $(VISION_VENV)
	$(VISION_VENV)/bin/pip install -q --disable-pip-version-check -r requirements-vision.txt \
		-e libs -e services/worker
	touch $@

# The managed llama.cpp server's environment (requirements-llama.txt says why it is separate and
# why its first build takes about 15 minutes).
LLAMA_VENV := .venv-llama
LLAMA_STAMP := $(LLAMA_VENV)/.installed

llama-env: $(LLAMA_STAMP)

# PyPI has no llama-cpp-python wheel for this platform: the first build compiles llama.cpp
# (about 15 minutes on 2 cores). The wheel is kept outside the checkout, so a fresh clone on the
# same machine installs it in seconds; delete the folder to rebuild.
LLAMA_WHEELS := $(HOME)/.cache/gantry/wheels
LLAMA_CPP_VERSION := $(shell sed -n 's/^llama-cpp-python\[server\]==//p' requirements-llama.txt)

$(LLAMA_STAMP): requirements-llama.txt
	test -x $(LLAMA_VENV)/bin/python || $(PYTHON) -m venv $(LLAMA_VENV)
	mkdir -p $(LLAMA_WHEELS)
	ls $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl > /dev/null 2>&1 || \
		$(LLAMA_VENV)/bin/pip wheel -q --disable-pip-version-check --no-deps -w $(LLAMA_WHEELS) \
		llama-cpp-python==$(LLAMA_CPP_VERSION)
	$(LLAMA_VENV)/bin/pip install -q --disable-pip-version-check --find-links $(LLAMA_WHEELS) \
		-r requirements-llama.txt
	touch $@

# The third-party clients the front-door tests drive (requirements-clients.txt says why they
# have their own environment).
CLIENTS_VENV := .venv-clients
CLIENTS_STAMP := $(CLIENTS_VENV)/.installed

clients-env: $(CLIENTS_STAMP)

$(CLIENTS_STAMP): requirements-clients.txt
	test -x $(CLIENTS_VENV)/bin/python || $(PYTHON) -m venv $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/pip install -q --disable-pip-version-check -r requirements-clients.txt
	touch $@

$(STAMP): requirements-dev.txt libs/pyproject.toml services/*/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-dev.txt \
		-e libs -e services/controlplane -e services/scheduler -e 'services/worker[ml]' \
		torch==2.13.0
	touch $@

proto: $(PROTO_STAMP)

$(PROTO_STAMP): $(STAMP) $(PROTO_FILES) $(KSERVE_PROTO_FILES)
	$(BIN)/python -m grpc_tools.protoc -I proto \
		--python_out=libs --pyi_out=libs --grpc_python_out=libs $(PROTO_FILES)
	$(BIN)/python -m grpc_tools.protoc -I gantry/kserve=proto/inference \
		--python_out=libs --pyi_out=libs --grpc_python_out=libs $(KSERVE_PROTO_FILES)
	touch $@

# docs/api/*.md from the protos' comments (tests/unit/test_api_docs.py fails while they differ).
docs: $(STAMP)
	$(BIN)/python scripts/gen_api_docs.py docs/api

# The worker maps the image adapters' environment as "vision" and the managed llama.cpp server's
# as "llama" unless the caller maps its own.
RUNTIME_ENV_MAP := {"vision": "$(CURDIR)/$(VISION_VENV)/bin/python", \
	"llama": "$(CURDIR)/$(LLAMA_VENV)/bin/python"}

run: $(PROTO_STAMP) $(VISION_STAMP) $(LLAMA_STAMP)
	GANTRY_PYTHON_ENV_MAP_JSON=$${GANTRY_PYTHON_ENV_MAP_JSON:-'$(RUNTIME_ENV_MAP)'} $(BIN)/gantry up

test: $(PROTO_STAMP) $(VISION_STAMP) $(LLAMA_STAMP) $(CLIENTS_STAMP)
	$(BIN)/python -m pytest -q --durations=30

test-unit: $(PROTO_STAMP)
	$(BIN)/python -m pytest -q tests/unit

test-integration: $(PROTO_STAMP)
	$(BIN)/python -m pytest -q tests/integration

lint: $(PROTO_STAMP)
	$(BIN)/ruff check libs services tests
	$(BIN)/ruff format --check libs services tests
	$(BIN)/mypy libs/gantry/common libs/gantry/cli services

bench: $(PROTO_STAMP) $(VISION_STAMP) $(LLAMA_STAMP)
	$(BIN)/python -m tests.bench.run

clean:
	rm -rf $(VENV) $(VISION_VENV) $(LLAMA_VENV) $(CLIENTS_VENV) $(PROTO_STAMP) \
		libs/gantry/v1/*_pb2*.py libs/gantry/v1/*_pb2.pyi \
		libs/gantry/kserve/*_pb2*.py libs/gantry/kserve/*_pb2.pyi
