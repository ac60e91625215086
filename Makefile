# The two commands a new user needs: `make demo` and `make test`.
# Everything here works on a fresh clone with nothing but Python 3.12+ and make.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell .ci/find-python)
# Django series to test against: 6.1 (native django.tasks) or 5.2 (django-tasks backport).
DJANGO ?= 6.1
VENV ?= .venv
PYTEST_ARGS ?=
DEMO_SECONDS ?=

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(DJANGO)

ifeq ($(DJANGO),5.2)
  # The type-checking tools target the newest Django; this leg only runs the tests.
  DJANGO_REQ := "Django~=5.2.0"
  EXTRAS := backport,binary,embedded,test
else
  DJANGO_REQ := "Django~=$(DJANGO).0"
  EXTRAS := dev
endif

.PHONY: help
help:
	@echo "make demo     run the example project (embedded PostgreSQL, admin, worker)"
	@echo "make test     run the whole test suite (embedded PostgreSQL unless DATABASE_URL is set)"
	@echo "make lint     ruff, mypy (strict), manage.py check, makemigrations --check"
	@echo "make docs     build the documentation (warnings are errors)"
	@echo "make bench    run the queuebench benchmark"
	@echo "make dist     build the sdist and wheel into dist/, check them, install the wheel and run the quick start"
	@echo "make screenshots  refresh the admin screenshots of the docs (headless Chromium)"
	@echo "make clean    remove the virtualenv, the embedded database and build output"

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "No Python 3.12+ found (see .ci/find-python)" >&2; exit 1; }
	@echo "Creating $(VENV) with $(PYTHON) (Django $(DJANGO))"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]" $(DJANGO_REQ)
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

.PHONY: venv
venv: $(STAMP)

.PHONY: browser
browser:
	@.ci/ensure-browser

.PHONY: pgbouncer
pgbouncer:
	@.ci/ensure-pgbouncer

.PHONY: test
test: venv browser pgbouncer
	$(BIN)/python -m pytest $(PYTEST_ARGS)

.PHONY: lint
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m tests.manage check --fail-level WARNING
	$(BIN)/python -m tests.manage makemigrations --check --dry-run django_pgqueue

.PHONY: screenshots
screenshots: venv browser
	PGQUEUE_TEST_SCREENSHOTS=docs/_static/admin $(BIN)/python -m pytest tests/test_admin_browser.py

.PHONY: docs
docs: venv
	$(BIN)/sphinx-build -E -W --keep-going -b html docs docs/_build/html

.PHONY: dist
dist: venv
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/python -m twine check --strict dist/*
	PGQUEUE_TEST_DIST=dist $(BIN)/python -m pytest -p no:cacheprovider tests/test_packaging.py

.PHONY: demo
demo: venv
	$(BIN)/python example_project/demo.py $(if $(DEMO_SECONDS),--seconds $(DEMO_SECONDS))

.PHONY: bench
bench: venv
	$(BIN)/python example_project/manage.py queuebench $(BENCH_ARGS)

.PHONY: clean
clean:
	-$(BIN)/python -m django_pgqueue.tools.embedded stop .pgdata 2>/dev/null
	rm -rf .venv .venv-* .pgdata .pgdata-* .ci-logs docs/_build build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
