# disque-py: every target installs what it needs, idempotently, on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
BASE_STAMP := $(VENV)/.base
PORT   ?= 7711
N      ?= 3
PYTEST_ARGS ?=

.PHONY: install bytecode compile compiled-build compiled-typecheck build-deps test-pure test-rewrites run test test-fast bench lint typecheck cluster cluster-stop cluster-status clean system-deps \
        spark-zip example chaos sim

# apt waits for a dpkg lock another apt run holds (a second `make` beside this one) rather than
# failing at once.
APT := apt-get -o DPkg::Lock::Timeout=600

# Debian packages the tests and the benchmark use: redis-cli / redis-benchmark (redis-tools) and
# redis-server (the "Redis as a queue" baseline of `make bench`); a Java runtime for Spark
# (PySpark runs a JVM: the Spark tests, `make example`, the Spark benchmark); chromium and
# chromedriver for the dashboard's browser test (tests/cluster/test_dashboard_browser.py).
system-deps:
	@if ! command -v redis-cli >/dev/null 2>&1 || ! command -v redis-server >/dev/null 2>&1; then \
		echo "installing Debian redis-tools and redis-server"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO $(APT) update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO $(APT) install -y -qq redis-tools redis-server >/dev/null; \
	fi
	@if ! command -v openssl >/dev/null 2>&1; then \
		echo "installing Debian openssl (the TLS tests make their certificates with it)"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO $(APT) update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO $(APT) install -y -qq openssl >/dev/null; \
	fi
	@if ! command -v java >/dev/null 2>&1; then \
		echo "installing a Debian Java runtime for Spark"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO $(APT) update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO $(APT) install -y -qq default-jre-headless >/dev/null; \
	fi
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
		echo "installing Debian chromium and chromium-driver for the dashboard's browser test"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO $(APT) update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO $(APT) install -y -qq chromium chromium-driver >/dev/null; \
	fi

# The install compiles the per-job hot path with mypyc (setup.py; the modules are
# disque/compiled.py's HOT_MODULES) in place, beside the sources, with the venv's pinned mypy
# (the editable install itself compiles nothing: the $(COMPILE_STAMP) rule below does, once,
# and again after a hot source changed): about 100 s on this 2-core machine
# (the C compile of one 18 MB file; setup.py turns off the gcc warning that cost 45 s more).
# DISQUE_NO_COMPILE=1 installs (and runs) pure Python; a failed compile warns and leaves pure
# Python (tried again when a hot source changes) unless DISQUE_REQUIRE_COMPILED=1 (CI), which
# makes it an error.
# Two steps: the package with its test tools (the compile needs only these), then the Spark
# extra (pyspark, pyarrow, pandas: half the install's time), which `make test` installs while
# the compile runs. The second step names the extra's packages (read from pyproject.toml)
# instead of installing '.[spark]': installing the package again would run setup.py, which
# removes the compiled build's record (DISQUE_NO_COMPILE=1) under the running compile.
SPARK_REQS = $(shell $(PY) -c 'import tomllib; print(" ".join(repr(r) for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["spark"]))')
$(BASE_STAMP): pyproject.toml setup.py
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip 'setuptools>=77'
	DISQUE_NO_COMPILE=1 $(PY) -m pip install -q -e '.[test]'
	@touch $(BASE_STAMP)

$(STAMP): $(BASE_STAMP)
	$(PY) -m pip install -q $(SPARK_REQS)
	@touch $(STAMP)

# The package's bytecode, written beside the sources: pip compiles what it installs, but not an
# editable install's own modules, and where PYTHONDONTWRITEBYTECODE is set (as on this
# machine) Python never writes it, so every server a test starts compiled the package's
# modules again (0.17-0.20 CPU-s a start with the bytecode, 0.23-0.28 without; `make test`
# starts about 700). Incremental: only sources changed since are compiled again.
bytecode: $(BASE_STAMP)
	@$(PY) -m compileall -q -j 0 disque tests benchmarks >/dev/null

# What the compile needs: a C compiler and the Python headers (Debian's gcc and, for a
# Debian Python, its -dev package; a pyenv or python.org Python carries its headers).
build-deps:
	@if ! command -v cc >/dev/null 2>&1; then \
		echo "installing Debian gcc for the compiled hot path"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO $(APT) update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO $(APT) install -y -qq gcc libc6-dev >/dev/null; \
	fi
	@if ! $(PYTHON) -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then \
		echo "installing the Debian Python headers for the compiled hot path"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO $(APT) update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO $(APT) install -y -qq python3-dev >/dev/null; \
	fi

HOT_SOURCES := $(shell $(PYTHON) -c 'import runpy; print(" ".join(m.replace(".", "/") + ".py" for m in runpy.run_path("disque/compiled.py")["HOT_MODULES"]))')
COMPILE_STAMP := $(VENV)/.compiled

ifeq ($(DISQUE_NO_COMPILE),1)
install: $(STAMP) bytecode
compiled-build: ;
else
install: $(STAMP) $(COMPILE_STAMP) bytecode
compiled-build: $(COMPILE_STAMP)

# After an edit of a hot module the compiled build no longer matches its source (disque
# refuses it at import and runs pure Python, with a warning): `make install` (and so `make
# test`) compiles it again.
# (after the base install: it runs setup.py without compiling, which drops the build's record)
$(COMPILE_STAMP): $(HOT_SOURCES) setup.py $(BASE_STAMP) | build-deps
	$(PY) setup.py -q build_ext --inplace
	@touch $@
endif

compile: $(BASE_STAMP) build-deps
	$(PY) setup.py -q build_ext --inplace
	@touch $(COMPILE_STAMP)

# the node's files (nodes.conf, AOF) go to run/node-PORT, which make clean removes
run: install
	$(VENV)/bin/disque-server conf/disque.conf --port $(PORT) --dir run/node-$(PORT)

# The suite on TEST_WORKERS pytest-xdist workers (each with its own port share; a test module,
# and all the Spark tests, stay on one worker: see tests/conftest.py), the 30 slowest listed.
# Most of a test's time is waiting on real servers: four workers keep this 2-core machine
# busy (measured quiet: 412 s with two, 323 s with three; on 2026-11-29 after the bytecode
# change, the whole CI run 418 s with three, 371 s with four). TEST_WORKERS=0 runs it in this
# one process.
TEST_WORKERS ?= 4
# the suite's workers take port shares 0..TEST_WORKERS-1, the pure-Python run beside it the last
PORT_SHARES := $(shell echo $$(( $(TEST_WORKERS) + 1 )))
# pytest rewrites the asserts of every test module it imports (9 CPU-s for the suite's, in
# each of the four workers and the pure-Python run) and keeps the result beside the module,
# unless PYTHONDONTWRITEBYTECODE is set (as on this machine and CI's): PYTEST clears it, and
# test-rewrites fills that cache once, beside the compile, before the workers start.
PYTEST = PYTHONDONTWRITEBYTECODE= $(PY) -m pytest
PYTEST_RUN = $(PYTEST) -q -n $(TEST_WORKERS) --durations=30

# Both builds are tested (issue 21). The whole suite runs on the compiled build (CI sets
# DISQUE_REQUIRE_COMPILED=1: a compile that fails, or a stale build, fails the run instead of
# testing pure Python). The pure-Python build, the fallback, runs the unit and simulation tests
# and a smoke set of real servers and clusters (PURE_SMOKE) with DISQUE_NO_COMPILE=1 (its
# servers too): `make test-pure`, which `make test` starts as soon as the Spark extra is
# installed, beside the compile (one core each on a fresh clone), and which goes on beside
# the suite if not done, on the last share of ports (the suite's servers mostly wait); its
# output is printed at the end
# (and kept in test-pure.log). (At nice 19 it starved: one of its servers was not up within
# 30 s while the suite's Spark and chaos tests ran.) DISQUE_NO_COMPILE=1 `make test` runs the
# whole suite on pure Python, and nothing beside it.
PURE_SMOKE ?= tests/integration/test_protocol.py tests/integration/test_addjob.py \
	tests/integration/test_getjob.py tests/integration/test_ack.py \
	tests/integration/test_internal_error.py tests/cluster/test_jobs.py
PURE_LOG := test-pure.log

ifeq ($(DISQUE_NO_COMPILE),1)
define BOTH_BUILDS
	$(MAKE) --no-print-directory system-deps typecheck test-rewrites
	$(1)
endef
else
# the compile starts first, beside the Debian packages (on a fresh machine apt takes 30 s,
# which the compile no longer waits for) and then the Spark install; then the pure-Python
# run; mypy and the suite once the compile is done
define BOTH_BUILDS
	@$(MAKE) --no-print-directory compiled-build & build=$$!; \
	$(MAKE) --no-print-directory system-deps $(STAMP) test-rewrites; irc=$$?; \
	( DISQUE_PORT_SLICE=$(TEST_WORKERS)/$(PORT_SHARES) $(MAKE) --no-print-directory test-pure > $(PURE_LOG) 2>&1 ) & pure=$$!; \
	wait $$build; brc=$$?; \
	[ $$irc = 0 ] && [ $$brc = 0 ] && $(MAKE) --no-print-directory compiled-typecheck && \
	DISQUE_PORT_SLICES=$(PORT_SHARES) $(1); rc=$$?; \
	wait $$pure; prc=$$?; \
	echo "== the pure-Python build (make test-pure, run alongside; all of it in $(PURE_LOG)):"; \
	tail -n 12 $(PURE_LOG); \
	[ $$rc = 0 ] && [ $$prc = 0 ]
endef
endif

test: $(BASE_STAMP) bytecode
	$(call BOTH_BUILDS,$(PYTEST_RUN) $(PYTEST_ARGS))

test-fast: $(BASE_STAMP) bytecode
	$(call BOTH_BUILDS,$(PYTEST_RUN) -m "not slow" $(PYTEST_ARGS))

test-pure: $(STAMP) system-deps bytecode
	DISQUE_NO_COMPILE=1 $(PYTEST) -q -n 0 -p no:cacheprovider tests/unit tests/sim \
		$(PURE_SMOKE)

# pytest's rewritten test modules written once (see PYTEST); a collection error is the suite's
# to report
test-rewrites: $(STAMP)
	@DISQUE_NO_COMPILE=1 $(PYTEST) --collect-only -q -p no:cacheprovider >/dev/null 2>&1 || true

# the compile, then mypy (one after the other: both run mypy over the same cache)
compiled-typecheck: compiled-build
	$(VENV)/bin/mypy

bench: install system-deps
	$(PY) -m benchmarks.run $(BENCH_ARGS)

# Chaos runs (tests/chaos/run.py): each nemesis (rolling kill -9 without / with AOF, SIGSTOP
# pauses, bus partitions, random kill -9 of up to 2 nodes without / with AOF) for
# CHAOS_SECONDS under load on 5 nodes, then the history checker's table.
CHAOS_SECONDS ?= 60
CHAOS_ARGS ?=
chaos: install
	$(PY) -m tests.chaos.run --seconds $(CHAOS_SECONDS) $(CHAOS_ARGS)

# Randomized simulation schedules (tests/sim/schedules.py) with rolling crashes; a failing
# seed prints its one-line reproduction. SIM_ARGS=--overflow: every node overflows to disk.
# SIM_JOBS processes run seeds side by side (0: one per CPU).
SEEDS ?= 1000
SIM_CRASHES ?= 3
SIM_RANDOM_KILL ?= 0
SIM_JOBS ?= 0
SIM_ARGS ?=
sim: install
	$(PY) -m tests.sim.schedules --seeds $(SEEDS) --crashes $(SIM_CRASHES) \
		--random-kill $(SIM_RANDOM_KILL) --jobs $(SIM_JOBS) $(SIM_ARGS)

lint: install typecheck
	$(VENV)/bin/ruff check disque tests benchmarks examples

# mypy over disque/ (settings in pyproject.toml: every def annotated), zero errors
typecheck: $(STAMP)
	$(VENV)/bin/mypy

# A local N-node cluster (default 3) on ports PORT.. (bus on +10000), in run/cluster/node-PORT.
cluster: install
	$(PY) -m disque.tools.cluster start --nodes $(N) --port $(PORT) $(if $(TLS),--tls)

cluster-stop: install
	$(PY) -m disque.tools.cluster stop

cluster-status: install
	$(PY) -m disque.tools.cluster status

# dist/disque-py.zip for Spark executors that do not have the package installed:
# spark-submit --py-files dist/disque-py.zip (disque.client + disque.spark + redis-py).
spark-zip: install
	$(PY) -m disque.spark.package --out dist/disque-py.zip

# examples/spark_pipeline.py: a 3-node cluster, a Spark job producing jobs, a consumer.
example: install system-deps
	$(PY) examples/spark_pipeline.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .hypothesis run bench-results \
		.mypy_cache disque/_compiled.json* test-pure.log
	find disque -name '*.so' -delete
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
