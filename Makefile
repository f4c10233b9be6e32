# kernmlops: `make collect` (the main job) and `make test` do all set-up on a
# fresh Debian/Ubuntu machine as root; re-running them is fast.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
BUILD := build
APT_PACKAGES := clang llvm libbpf-dev libbpf1 bpftool stress-ng fio python3-venv
BPF_INPUTS := $(wildcard src/kernmlops/bpf/*.c src/kernmlops/bpf/*.h)
# Extra arguments: make collect ARGS="-b faux -d 30"; make test PYTEST_ARGS="-k ringbuf"
ARGS ?=
PYTEST_ARGS ?=

.PHONY: all setup packages tracefs bpf collect collect-raw test defaults lint format hooks doctor bench clean

all: setup

packages:
	@scripts/ensure-packages.sh $(APT_PACKAGES)

$(VENV)/.installed: pyproject.toml | packages
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

# Rebuilt when a BPF source or header changes (the Python side checks mtimes too).
$(BUILD)/bpf/.built: $(BPF_INPUTS) $(VENV)/.installed
	$(BIN)/kernmlops build-bpf --out $(BUILD)/bpf
	@touch $@

bpf: $(BUILD)/bpf/.built

# Tracepoint programs need tracefs; some machines do not mount it.
tracefs:
	@test -d /sys/kernel/tracing/events || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null \
	  || echo "note: tracefs not mounted (needs root); tracepoint programs will not attach" >&2

setup: packages $(VENV)/.installed bpf tracefs

collect: setup
	$(BIN)/kernmlops collect $(ARGS)

collect-raw: setup
	$(BIN)/kernmlops collect -b faux $(ARGS)

test: setup
	$(BIN)/pytest $(PYTEST_ARGS)

doctor: setup
	$(BIN)/kernmlops doctor

defaults: $(VENV)/.installed
	$(BIN)/kernmlops defaults defaults.yaml

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

format: $(VENV)/.installed
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

hooks: $(VENV)/.installed
	$(BIN)/pre-commit install

clean:
	rm -rf $(BUILD) .pytest_cache .ruff_cache
