# kernmlops: `make collect` (the main job) and `make test` do all set-up on a
# fresh Debian/Ubuntu machine as root; re-running them is fast.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
BUILD := build
APT_PACKAGES := gcc clang llvm libbpf-dev libbpf1 bpftool stress-ng fio rt-tests redis-server redis-tools prometheus chromium python3-venv openssl systemd libcap2-bin util-linux
BPF_INPUTS := $(wildcard src/kernmlops/bpf/*.c src/kernmlops/bpf/*.h src/kernmlops/native/*.c)
# Extra arguments: make collect ARGS="-b faux -d 30"; make test PYTEST_ARGS="-k ringbuf"
ARGS ?=
PYTEST_ARGS ?=
# The settings `make collect` and the benchmark-* targets run with (kernmlops' form or
# KernMLOps'): make collect KERNMLOPS_CONFIG_FILE=my.yaml. As in KernMLOps,
# overrides.yaml where there is one, else defaults.yaml.
KERNMLOPS_CONFIG_FILE ?= $(if $(wildcard overrides.yaml),overrides.yaml,defaults.yaml)
COLLECT := $(BIN)/kernmlops collect -c $(KERNMLOPS_CONFIG_FILE)
# What the memcached and linux-build benchmarks run (`make test` installs them too)
BENCHMARK_PACKAGES := memcached libmemcached-tools linux-source-6.1 make gcc flex bison bc libelf-dev libssl-dev

LAB_PACKAGES := qemu-system-x86 linux-image-amd64 busybox-static kmod make
KMOD_INPUTS := $(wildcard src/kernmlops/lb/kmod/*.c src/kernmlops/lb/kmod/Kbuild)
# Spark, to prove collections read there too (tests/faults/test_spark.py)
INTEROP_PACKAGES := openjdk-17-jre-headless

.PHONY: all setup ml lab kmod interop packages tracefs bpf wheel collect collect-raw collect-data \
	test defaults lint format hooks pre-commit doctor bench clean setup-gap benchmark-packages \
	benchmark-gap benchmark-memcached benchmark-linux-build benchmark-redis dump

all: setup

packages:
	@scripts/ensure-packages.sh $(APT_PACKAGES)

$(VENV)/.installed: pyproject.toml | packages
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,lab,tracing]'
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

# A CPU-only PyTorch for ml-training and pytorch (see the script: PyPI's Linux
# torch is the CUDA build). TORCH_INDEX / TORCH_VERSION choose the wheel.
$(VENV)/.torch: $(VENV)/.installed scripts/ensure-torch.sh
	@scripts/ensure-torch.sh $(BIN)/python
	@touch $@

ml: $(VENV)/.torch

setup: packages $(VENV)/.installed ml bpf tracefs

# A wheel with the BPF objects built in (no clang or bpftool needed where it runs).
wheel: $(VENV)/.installed
	$(BIN)/python -m build --wheel --outdir dist .

# The kernel lab (kernmlops vm): QEMU, Debian's kernel (kprobes, BTF, NUMA
# emulation) and busybox for virtme-ng, the headers of exactly that kernel
# and the kmo_lb module built against them (kernmlops lb deploy). Installed
# by `make test` too.
lab: packages $(VENV)/.installed
	@scripts/ensure-packages.sh $(LAB_PACKAGES)
	@scripts/ensure-packages.sh $$(scripts/lab-headers.sh)
	@$(MAKE) --no-print-directory kmod

# kmo_lb.ko for the lab's kernel, rebuilt when its source changes.
$(BUILD)/kmod/.built: $(KMOD_INPUTS) $(VENV)/.installed
	$(BIN)/kernmlops lb build-kmod
	@touch $@

kmod: $(BUILD)/kmod/.built

# Spark (pyspark + a Java runtime) for the interoperability tests. Installed by `make test`.
$(VENV)/.interop: pyproject.toml $(VENV)/.installed
	@scripts/ensure-packages.sh $(INTEROP_PACKAGES)
	$(BIN)/python -m pip install -q -e '.[interop]'
	@touch $@

interop: $(VENV)/.interop

collect: setup
	$(COLLECT) $(ARGS)

# KernMLOps' names: collect-data is collect; benchmark-<b> runs one benchmark with the
# same settings file.
collect-data: collect

collect-raw: setup
	$(COLLECT) -b faux $(ARGS)

# KernMLOps' dump: every table under data/curated, as its data call reads them
dump: $(VENV)/.installed
	$(BIN)/kernmlops collect dump $(ARGS)

benchmark-packages:
	@scripts/ensure-packages.sh $(BENCHMARK_PACKAGES)

benchmark-gap: setup
	$(COLLECT) -b gap $(ARGS)

benchmark-memcached: setup benchmark-packages
	$(COLLECT) -b memcached $(ARGS)

benchmark-linux-build: setup benchmark-packages
	$(COLLECT) -b linux-build $(ARGS)

benchmark-redis: setup
	$(COLLECT) -b redis $(ARGS)

test: setup lab interop benchmark-packages
	$(BIN)/pytest $(PYTEST_ARGS)

# GAP benchmark suite for `kernmlops collect -b gap`, built outside the repo where
# the gap benchmark looks by default (benchmark.gap.source_dir overrides it).
GAP_DIR ?= $(HOME)/.cache/kernmlops/gapbs
GAP_REPO ?= https://github.com/sbeamer/gapbs

# Clone once (shallow) where the network allows, then build; re-running rebuilds
# only what changed. A copy built elsewhere works too: benchmark.gap.source_dir.
setup-gap:
	@scripts/ensure-packages.sh git g++ make
	@if [ ! -f "$(GAP_DIR)/Makefile" ]; then \
	  if [ -e "$(GAP_DIR)" ] && [ -n "$$(ls -A "$(GAP_DIR)")" ]; then \
	    echo "error: $(GAP_DIR) is not empty and holds no GAP Makefile; move it away or set GAP_DIR=<folder>" >&2; \
	    exit 1; \
	  fi; \
	  echo "cloning $(GAP_REPO) into $(GAP_DIR)"; \
	  mkdir -p "$(GAP_DIR)"; \
	  if ! git clone -q --depth 1 "$(GAP_REPO)" "$(GAP_DIR)"; then \
	    rm -rf "$(GAP_DIR)"; \
	    echo "error: cannot clone $(GAP_REPO) (does the network allow GitHub?)." >&2; \
	    echo "  Build GAP where it does (git clone $(GAP_REPO) && make -C gapbs), copy the folder" >&2; \
	    echo "  here and set benchmark.gap.source_dir to it, or build the copy: make setup-gap GAP_DIR=<copy>" >&2; \
	    exit 1; \
	  fi; \
	fi
	$(MAKE) -C "$(GAP_DIR)" -j
	@echo "GAP is built in $(GAP_DIR); kernmlops collect -b gap looks there by default"

doctor: setup
	$(BIN)/kernmlops doctor

# the performance benchmarks (bench/README.md): what there is; run one with
# sudo $(BIN)/python -m bench <name> [options]
bench: $(VENV)/.installed
	$(BIN)/python -m bench list

# the plug-in indexes (hooks/_index.py, benchmarks/_index.py), then defaults.yaml
defaults: $(VENV)/.installed
	$(BIN)/python -m kernmlops.plugin_indexes
	$(BIN)/kernmlops defaults defaults.yaml

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

format: $(VENV)/.installed
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

hooks: $(VENV)/.installed
	$(BIN)/pre-commit install

# every pre-commit check on every file (what a commit checks on its own files)
pre-commit: $(VENV)/.installed
	$(BIN)/pre-commit run -a

clean:
	rm -rf $(BUILD) .pytest_cache .ruff_cache
