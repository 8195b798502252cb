# Two commands on a fresh machine:
#   make run   - venv, requirements, services, migrations, demo data, every Procfile process
#   make test  - venv, requirements, services, then ruff and the whole pytest suite, in
#                TEST_WORKERS pytest-xdist workers (each with its own test database, Redis
#                database, metrics directory and ports: docs/reference/tests.md)
#   make test-fast - the unit and API layers (no process, not the console), in parallel,
#                on the existing test databases, property and race tests at a fifth of
#                their count: the loop between two changes
#   make test-console - the console's layer (the Django admin), the same way
#   make chaos - the full fault-injection run (20,000 payments) on private PostgreSQL/Redis
#   make chaos-ci - the small fault-injection run .ci/run does on every submission
#   make bench / bench-all - the due-time burst benchmark (docs/reference/benchmarks.md)
# Both are idempotent; the venv is reinstalled only when a requirements file changes.
# PYTEST_ARGS adds options to both test targets (e.g. PYTEST_ARGS="-x tests/ledger",
# PYTEST_ARGS=--create-db for test-fast after a new migration).

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | sha1sum | cut -c1-12)
PORT ?= 8000
# pytest-xdist workers for `make test` and `make test-fast` (measured in docs/reference/tests.md:
# the end-to-end tests mostly wait, so more workers than cores pays). Worker i uses the Redis
# database REDIS_URL's minus i (default 15, 14, 13): at most 15 workers.
TEST_WORKERS ?= 3
TEST_FAST_SCALE ?= 0.2
PYTEST_ARGS ?=
DEMO_RECEIVER_PORT ?= 8099
export PATH := $(abspath $(BIN)):$(PATH)
# Bytecode and pytest's rewritten test modules are cached in __pycache__/ (git-ignored):
# an environment with PYTHONDONTWRITEBYTECODE set compiles every module again in every
# test process (7 s of collection instead of 3, for each xdist worker).
unexport PYTHONDONTWRITEBYTECODE
# Every process `make run` starts writes its metrics to this directory; web's /metrics
# sums them (docs/reference/operations.md, "Metrics"). The tests use their own (pyproject.toml).
METRICS_DIR := $(or $(PROMETHEUS_MULTIPROC_DIR),$(abspath var/prometheus))

.PHONY: run test test-fast test-console screenshots install services browser lint check-deploy flower metrics-dir schema openapi chaos chaos-ci \
  bench bench-all docs ha-packages test-ha chaos-ha

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

$(STAMP): requirements.txt requirements-dev.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

# Start PostgreSQL and Redis when they are installed here but not running.
services:
	@pg_isready -q -h 127.0.0.1 -p 5432 || { \
	  echo "starting PostgreSQL"; \
	  pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql | tail -n 1) main start; \
	  for i in $$(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done; }
	@redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || { \
	  echo "starting Redis"; \
	  redis-server --daemonize yes --port 6379 --save "" --appendonly no; \
	  for i in $$(seq 1 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 1; done; }

# A fresh start: the previous run's processes are gone, so are their metrics files.
metrics-dir:
	mkdir -p "$(METRICS_DIR)"
	find "$(METRICS_DIR)" -maxdepth 1 -name '*.db' -delete

run: export PROMETHEUS_MULTIPROC_DIR = $(METRICS_DIR)
run: install services metrics-dir
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py ensure_database
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py migrate --noinput
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py staff_groups
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py demo \
	  --webhook-url http://127.0.0.1:$(DEMO_RECEIVER_PORT)/ --webhook-secret-file var/demo-webhook-secrets
	@# The Procfile's processes plus a demo webhook receiver (devtools/webhook_receiver.py: it
	@# verifies each signature and logs one JSON line per delivery to var/demo-webhooks.jsonl).
	@{ cat Procfile; echo "demo-receiver: python -m devtools.webhook_receiver --port $(DEMO_RECEIVER_PORT)" \
	  "--secret-file var/demo-webhook-secrets --log var/demo-webhooks.jsonl"; } > var/Procfile.run
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/honcho -f var/Procfile.run -d . start -p $(PORT) \
	  web worker promoter webhooks payouts gateway beat demo-receiver

# Flower (optional): the Celery monitoring UI on http://127.0.0.1:5555 (FLOWER_PORT).
flower: install
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/honcho start flower

# The admin's browser test (tests/e2e/test_admin_browser.py) drives Debian's Chromium, never a
# downloaded browser build. Installed here when missing and we can (root with apt-get); where
# we cannot, the test skips and says why.
browser:
	@if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "installing chromium for the browser test"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	    || echo "chromium could not be installed; the browser test will be skipped"; \
	fi

# The high-availability tests (tests/ha/, marker "ha") build a pg_auto_failover cluster (a monitor
# and two nodes) and a Redis Sentinel set on loopback with devtools/ha.py. Debian's packages,
# installed here when missing and we can (root with apt-get); where we cannot, the tests skip.
ha-packages:
	@if { ! command -v pg_autoctl >/dev/null 2>&1 || ! command -v redis-sentinel >/dev/null 2>&1 \
	      || ! command -v redis-server >/dev/null 2>&1; } \
	  && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "installing postgresql-15-auto-failover, redis-server and redis-sentinel for the HA tests"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      postgresql-15-auto-failover redis-server redis-sentinel >/dev/null; } \
	    || echo "the HA packages could not be installed; tests/ha will be skipped"; \
	fi

# Failover of PostgreSQL (kill -9 and SIGSTOP of the primary) and of Redis behind Sentinel:
# two to two and a half minutes, printing the failover times (-s); not part of `make test`.
test-ha: install ha-packages
	$(BIN)/pytest -m ha -s tests/ha

# Failover under load (devtools/failover.py): a pg_auto_failover cluster, the real stack and
# API clients; the primary killed (or frozen, or switched over) during each of five bursts of
# 10,000 payments. FAILOVER_ARGS adds options (e.g. FAILOVER_ARGS="--mode stop").
chaos-ha: install ha-packages
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py failover $(FAILOVER_ARGS)

# --dist loadgroup: tests spread one by one over the workers, except the modules marked
# xdist_group, each kept on one worker (docs/reference/tests.md says why for each).
test: install services browser lint docs $(BIN)/promtool
	$(BIN)/pytest --create-db -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# No lint, docs or browser: only the tests marked neither processes nor e2e/browser
# (tests/conftest.py), which fail if they start a process anyway.
# The unit and API layers: every test that starts no process and is not the console's,
# with the property tests' examples and the race tests' rounds at TEST_FAST_SCALE of their
# count (tests/scale.py). make test runs all of them in full.
test-fast: install services
	DELAYPAY_TEST_SCALE=$(TEST_FAST_SCALE) $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup \
	  -m "not processes and not console" $(PYTEST_ARGS)

# The console's layer (the Django admin through the test client), the same way.
test-console: install services
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup -m "console and not processes" $(PYTEST_ARGS)

# The console's pictures in the docs (docs/reference/admin-console.md), taken by the browser
# test; a plain test run writes them to var/screenshots/ instead.
screenshots: install services browser
	DELAYPAY_SCREENSHOTS=docs/img/console $(BIN)/pytest --create-db tests/e2e/test_admin_browser.py

# The documentation site (mkdocs.yml, docs/): --strict turns every warning (a broken link,
# a page missing from the nav) into a failure. Open var/site/index.html.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir var/site

# promtool validates deploy/prometheus/ in the tests. It comes from Debian's prometheus
# package, unpacked into the venv: nothing is installed system-wide, no service starts.
# Best effort: without it the test says so and falls back to checking the rules in Python.
$(BIN)/promtool: | $(BIN)/python
	@tmp=$$(mktemp -d); \
	( cd $$tmp && { apt-get download prometheus >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && apt-get download prometheus >/dev/null 2>&1; }; } ) && \
	dpkg-deb --fsys-tarfile $$tmp/prometheus_*.deb | tar -xO ./usr/bin/promtool > $$tmp/promtool && \
	chmod +x $$tmp/promtool && mv $$tmp/promtool $@ || \
	echo "promtool unavailable: tests/ops/test_deploy.py will check the rules without it"; \
	rm -rf $$tmp

# The chaos run starts and crashes its own PostgreSQL cluster and redis-server on
# private ports; it never touches the shared services. CHAOS_ARGS adds options
# (e.g. CHAOS_ARGS="--seed 1234" to replay a seed).
chaos: install
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py chaos $(CHAOS_ARGS)

chaos-ci: install
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py chaos --payments 2000 --faults 20 --window 30 \
	  --workers 2 --shards 2 --replica $(CHAOS_ARGS)

# ruff, then bandit's static security scan of the product and the tools (pyproject.toml
# [tool.bandit] lists the checks skipped and why; single findings carry "# nosec" with a reason).
lint: install
	$(BIN)/ruff check .
	$(BIN)/bandit --quiet --configfile pyproject.toml --recursive api common console delaypay devtools ledger payments payouts rails recurring webhooks

# Production settings must pass Django's deployment checklist.
check-deploy: install
	DJANGO_DEBUG=0 DJANGO_SECRET_KEY=$$(head -c 48 /dev/urandom | base64) $(BIN)/python manage.py check --deploy --fail-level WARNING

# The OpenAPI schema, validated (warnings are errors), written to var/openapi.yaml.
schema: install
	mkdir -p var
	DJANGO_DEBUG=1 $(BIN)/python manage.py spectacular --validate --fail-on-warn --file var/openapi.yaml

# The endpoint reference of the docs site: the served schema, byte for byte, to
# docs/reference/openapi.yaml and its Markdown rendering to docs/reference/endpoints.md
# (tests/ops/test_openapi_reference.py fails when either is stale).
openapi: install
	DJANGO_DEBUG=1 $(BIN)/python manage.py openapi_reference

# The due-time burst benchmark on scratch databases (docs/reference/benchmarks.md). BENCH_ARGS adds
# options, e.g. make bench BENCH_ARGS="--workers 2 --profile".
BENCH_OUT ?= bench-out
bench: install services
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py bench burst --json $(BENCH_OUT)/burst.json --chart $(BENCH_OUT)/burst.png $(BENCH_ARGS)

bench-all: install services
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py bench all --json $(BENCH_OUT)/all.json --chart $(BENCH_OUT)/all.png $(BENCH_ARGS)
