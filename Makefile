# Two commands for a newcomer: `make run` and `make test`. Everything else is a helper.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
# This machine's pip config names local mirrors that may be absent: hide that noise.
PIP_QUIET := 2>&1 | { grep -v "^WARNING: Location .* is ignored" || true; }
PYTHON ?= $(shell scripts/find-python)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PORT ?= 8080

.PHONY: install run dev test stop-loop lint format check clean token admin-password credentials shell help bench bench-quick bench-server screenshots slurm-up slurm-down

help:
	@echo "make run    install, migrate, serve the console on http://127.0.0.1:$(PORT)"
	@echo "make test   install, lint (ruff, the import contracts, mypy), run every test"

$(STAMP): requirements.txt pyproject.toml
	@if [ -z "$(PYTHON)" ]; then scripts/find-python; exit 1; fi
	@echo "Installing into $(VENV) with $(PYTHON)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt $(PIP_QUIET)
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e . $(PIP_QUIET)
	@touch $(STAMP)

install: $(STAMP)

run: install
	@PORT=$(PORT) $(BIN)/python scripts/run.py

dev: install
	@PORT=$(PORT) $(BIN)/python scripts/run.py --dev

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

check: install
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/python manage.py check

# The migration check loads the test settings, so it attaches to (or starts) the tests'
# PostgreSQL under var/pg-test, which pytest stops at the end; on failure it stops it here.
TEST_SETTINGS := DJANGO_SETTINGS_MODULE=lakeshore_admin.settings_test
STOP_TEST_DB := $(BIN)/python -c "import django; django.setup(); from django.conf import settings as s; from lakeshore_admin import embedded_db; s.EMBEDDED_PGDATA and embedded_db.stop(s.EMBEDDED_PGDATA)"

# TEST_MARKS narrows make test's first pass by pytest's -m (.ci/run's second pass, against
# Debian's PostgreSQL, takes "not slow"); the soak runs whatever it says.
TEST_MARKS ?=
FIRST_PASS := not soak$(if $(TEST_MARKS), and ($(TEST_MARKS)))

test: lint
	$(TEST_SETTINGS) $(BIN)/python manage.py makemigrations --check --dry-run >/dev/null || { echo "Model changes without a migration: run '$(BIN)/python manage.py makemigrations'"; $(TEST_SETTINGS) $(STOP_TEST_DB); exit 1; }
# The soak test (-m soak) restarts the database server: it runs after the rest, in a
# pytest of its own without xdist. A pass that PYTEST_ARGS leaves empty (exit code 5) is
# no failure, unless both are.
	@run() { echo "$$*"; "$$@"; }; \
	run $(BIN)/pytest -n 2 --dist loadgroup -m "$(FIRST_PASS)" $(PYTEST_ARGS); rest=$$?; \
	if [ $$rest -ne 0 ] && [ $$rest -ne 5 ]; then exit $$rest; fi; \
	run $(BIN)/pytest -m soak $(PYTEST_ARGS); soak=$$?; \
	if [ $$soak -ne 0 ] && [ $$soak -ne 5 ]; then exit $$soak; fi; \
	if [ $$rest -eq 5 ] && [ $$soak -eq 5 ]; then echo "PYTEST_ARGS selected no test"; exit 5; fi

# Every way of stopping `make run` (Ctrl-C, twice, SIGTERM, the parent killed, kill -9 of
# everything), STOP_LOOPS times each against the real thing (tests/ops/test_stop_loop.py;
# `make test` runs each once): some 20 minutes for the 20.
STOP_LOOPS ?= 20
stop-loop: install
	STOP_LOOPS=$(STOP_LOOPS) $(BIN)/pytest -s tests/ops/test_stop_loop.py

token: install
	@$(BIN)/python manage.py create_token --user admin --role operator

admin-password: install
	$(BIN)/python manage.py changepassword admin

# make run's first admin login and token, kept in var/credentials (mode 0600).
credentials:
	@cat "$${LAKESHORE_VAR_DIR:-var}/credentials" 2>/dev/null || echo "No credentials kept here yet: make run writes them at its first start ('make token' prints a new operator token, 'make admin-password' sets a new password)."

# A shell with this checkout's lakeshore first on PATH (exit to leave).
shell: install
	@echo "lakeshore here is $(CURDIR)/$(BIN)/lakeshore; exit to leave this shell."
	@PATH="$(CURDIR)/$(BIN):$$PATH" $${SHELL:-bash}

clean:
	rm -rf $(VENV) var/pg var/pg-test

# The console tour (README): every page in light and dark, at 1280 and 390 px.
screenshots: install
	rm -rf docs/tour && mkdir -p docs/tour
	LAKESHORE_SCREENSHOTS=$(CURDIR)/docs/tour $(BIN)/pytest tests/web/browser/test_console_tour.py -k shot
	@echo "written to docs/tour/"

# A private one-node Slurm cluster (README "Providers"): Debian's slurmctld, slurmd and
# munge on 127.0.0.1 with private ports, all under SLURM_DIR. SLURM_CI_INSTALL=1 lets
# it apt-get install them.
SLURM_DIR ?= /tmp/lakeshore-slurm
slurm-up:
	@scripts/slurm/up $(SLURM_DIR) >/dev/null
	@echo "export SLURM_CONF=$(SLURM_DIR)/etc/slurm.conf"

slurm-down:
	@scripts/slurm/down $(SLURM_DIR)

bench: install
	$(BIN)/python -m bench.compare

# One short round of every row (BENCH_QUICK=1), in minutes: var/bench-run/partial.md.
# Only the full `make bench` writes bench/results/latest.md.
bench-quick: install
	BENCH_QUICK=1 $(BIN)/python -m bench.compare

bench-server: install
	$(BIN)/python bench/server_bench.py
