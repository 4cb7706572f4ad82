# workd: a thin wrapper over CMake and the scripts. `make run` and `make test`
# work on a bare Debian 12 machine: they install what is missing first.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_TYPE ?= RelWithDebInfo

.PHONY: all deps build test test-asan run clean clean-data check-format format lint lint-openapi bench chaos fuzz

all: build

deps:
	@scripts/install-deps

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(CMAKE_TYPE) >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

# The whole suite: unit tests, then integration tests against real processes and
# a private PostgreSQL made for the run.
test: build
	@cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

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
# a demo producer and a result consumer. Ctrl-C stops everything.
run: build
	@scripts/run-local

# The long chaos run: every fault kind several times, then mixed (~5 minutes).
chaos: build
	@python3 tests/chaos/chaos.py --long --bin-dir $(BUILD)/bin

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

lint: build
	@cppcheck --quiet --error-exitcode=1 --enable=warning,portability,performance \
		--inline-suppr --suppress=missingIncludeSystem -D__GNUC__ \
		-I common -I server -I server/manager -I server/frontend -I worker \
		common server worker

# The benchmarks: each figure on its own private PostgreSQL (default durability)
# and cluster, one key=value line per figure; docs/benchmarks.md reads them.
bench: build
	@scripts/bench

# The API contract: openapi.yaml through the OpenAPI linter pinned in
# tools/openapi (installed there on first use).
lint-openapi: deps
	@scripts/lint-openapi
