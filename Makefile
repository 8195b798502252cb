# Two commands on a fresh machine:
#   make run   - venv, requirements, services, migrations, demo data, every Procfile process
#   make test  - venv, requirements, services, then ruff and the whole pytest suite
#   make chaos - the full fault-injection run (20,000 payments) on private PostgreSQL/Redis
#   make chaos-ci - the small fault-injection run .ci/run does on every submission
# Both are idempotent; the venv is reinstalled only when a requirements file changes.

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | sha1sum | cut -c1-12)
PORT ?= 8000
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: run test install services lint check-deploy chaos chaos-ci

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

# The chaos run starts and crashes its own PostgreSQL cluster and redis-server on
# private ports; it never touches the shared services. CHAOS_ARGS adds options
# (e.g. CHAOS_ARGS="--seed 1234" to replay a seed).
chaos: install
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py chaos $(CHAOS_ARGS)

chaos-ci: install
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py chaos --payments 2000 --faults 20 --window 30 \
	  --workers 2 $(CHAOS_ARGS)

lint: install
	$(BIN)/ruff check .

# Production settings must pass Django's deployment checklist.
check-deploy: install
	DJANGO_DEBUG=0 DJANGO_SECRET_KEY=$$(head -c 48 /dev/urandom | base64) $(BIN)/python manage.py check --deploy --fail-level WARNING
