# Two commands on a fresh machine:
#   make run   - venv, requirements, services, migrations, demo data, every Procfile process
#   make test  - venv, requirements, services, then ruff and the whole pytest suite
# and the benchmark (README "Benchmarks"): make bench (burst), make bench-all (every scenario)
# Both are idempotent; the venv is reinstalled only when a requirements file changes.

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | sha1sum | cut -c1-12)
PORT ?= 8000
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: run test install services lint check-deploy bench bench-all

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

run: install services
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py ensure_database
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py migrate --noinput
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py demo
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/honcho start -p $(PORT) web worker promoter beat

test: install services lint
	$(BIN)/pytest --create-db

lint: install
	$(BIN)/ruff check .

# Production settings must pass Django's deployment checklist.
check-deploy: install
	DJANGO_DEBUG=0 DJANGO_SECRET_KEY=$$(head -c 48 /dev/urandom | base64) $(BIN)/python manage.py check --deploy --fail-level WARNING

# The due-time burst benchmark on scratch databases (README "Benchmarks"). BENCH_ARGS adds
# options, e.g. make bench BENCH_ARGS="--workers 2 --profile".
BENCH_OUT ?= bench-out
bench: install services
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py bench burst --json $(BENCH_OUT)/burst.json --chart $(BENCH_OUT)/burst.png $(BENCH_ARGS)

bench-all: install services
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py bench all --json $(BENCH_OUT)/all.json --chart $(BENCH_OUT)/all.png $(BENCH_ARGS)
