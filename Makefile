# workd: a thin wrapper over CMake and the scripts. `make run` and `make test`
# work on a bare Debian 12 machine: they install what is missing first.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_TYPE ?= RelWithDebInfo

.PHONY: all deps deps-run build test test-asan test-compose run clean clean-data check-format \
	format lint lint-openapi bench soak chaos chaos-db fuzz

all: build

# Everything: building, running, the tests, the linters and CI.
deps:
	@scripts/install-deps

# Only what building and `make run` need.
deps-run:
	@scripts/install-deps run

build: deps-run
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(CMAKE_TYPE) >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

# The whole suite: unit tests, then integration tests against real processes and
# a private PostgreSQL made for the run.
test: deps build
	@cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

# The compose cluster for real (a few minutes, more on a first run): builds the
# image from the Dockerfile, starts docker-compose.yml with three workers, kills
# a server, checks every job completes once. Without a Docker engine it sets up
# Debian's podman to serve the Docker API (scripts/container-env).
test-compose: deps
	@python3 tests/compose/test_compose.py

# The same suite with AddressSanitizer and UndefinedBehaviorSanitizer.
test-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DWORKD_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j$(JOBS)
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j$(JOBS)

# Every parser of untrusted input under libFuzzer (tests/fuzz), with ASan and
# UBSan, in its own clang build (build-fuzz): FUZZ_SECONDS per target.
FUZZ_SECONDS ?= 20
fuzz: deps
	@scripts/fuzz $(FUZZ_SECONDS)

# The local cluster: private PostgreSQL under var/, two servers, two workers,
# a demo producer and a result consumer. Ctrl-C stops everything. The build is
# quiet: its output goes to var/log/build.log, and only a failure shows it.
run: deps-run
	@mkdir -p var/log
	@echo "make run: building (output in var/log/build.log)"
	@{ cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(CMAKE_TYPE) && \
	   cmake --build $(BUILD) -j$(JOBS); } >var/log/build.log 2>&1 || { \
	   { grep -qE '(error|Error):' var/log/build.log && grep -E -A3 '(error|Error):' var/log/build.log | head -80 \
	     || tail -40 var/log/build.log; } >&2; \
	   echo "make run: the build failed (whole output in var/log/build.log)" >&2; exit 1; }
	@scripts/run-local

# The long chaos run: every fault kind several times, then mixed (~5 minutes).
chaos: build
	@python3 tests/chaos/chaos.py --long --bin-dir $(BUILD)/bin

# workd on PostgreSQL replicated and failed over by Patroni (etcd, a primary and
# a synchronous standby), 500 jobs/s: the primary killed 5 times each way, two
# switchovers, a lost standby in strict mode (~5 minutes; docs/reliability.md);
# then the short form with shard 1's database on the Patroni cluster and the
# home database (shard 0) a private one: the faults hit a shard's database.
chaos-db: build
	@python3 tests/chaos/dbfailover.py --long --bin-dir $(BUILD)/bin
	@python3 tests/chaos/dbfailover.py --short --shard-databases --bin-dir $(BUILD)/bin

clean-data:
	@scripts/pg-private destroy var/pg 2>/dev/null || true
	@rm -rf var

clean:
	@rm -rf $(BUILD) $(ASAN_BUILD)

SOURCES = $(shell git ls-files '*.c' '*.h' 2>/dev/null)

check-format:
	@clang-format --dry-run --Werror $(SOURCES)

format:
	@clang-format -i $(SOURCES)

lint: deps build
	@cppcheck --quiet --error-exitcode=1 --enable=warning,portability,performance \
		--inline-suppr --suppress=missingIncludeSystem -D__GNUC__ \
		-I common -I server -I server/core -I server/store -I server/manager -I server/frontend -I worker -I cli \
		common server worker cli

# The benchmarks: each figure on its own private PostgreSQL (default durability)
# and cluster, one key=value line per figure; docs/benchmarks.md reads them.
bench: build
	@scripts/bench

# The soak (about 25 minutes): ten minutes of constant load with a retention
# of one minute, then again with another session holding a transaction open.
# SOAK_RATE sets the load (jobs/s; about half the drain rate).
soak: build
	@scripts/bench --only soak
	@scripts/bench --only soak --soak-hold

# The API contract: openapi.yaml through the OpenAPI linter pinned in
# tools/openapi (installed there on first use).
lint-openapi: deps
	@scripts/lint-openapi
