#!/usr/bin/env bash
# A CPU-only PyTorch for the ml-training and pytorch benchmarks (LeNet-5 on the CPU).
#
# PyPI's torch for Linux x86_64 is the CUDA build: it pulls about 3 GB of
# nvidia-* wheels that a CPU job never loads. CPU builds carry the local version
# "+cpu" and are served by PyTorch's own index (TORCH_INDEX), or by whatever index
# or wheel folder pip is configured with. Where pip finds none, Debian's
# python3-torch (a CPU build, older) is installed instead, and the job runs under
# the system python3 (kernmlops.benchmarks.ml_training.job_python). Where neither
# works, ml-training trains its numpy fallback and says so; nothing else fails.
#
# Usage: scripts/ensure-torch.sh VENV_PYTHON
set -euo pipefail
py=$1
TORCH_VERSION=${TORCH_VERSION:-2.13.0+cpu}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

has_torch() { "$1" -c 'import torch' >/dev/null 2>&1; }

has_torch "$py" && exit 0
echo "installing torch $TORCH_VERSION (CPU build) into the venv" >&2
if "$py" -m pip install -q --retries 1 --timeout 30 --only-binary=:all: \
    --extra-index-url "$TORCH_INDEX" "torch==$TORCH_VERSION"; then
  exit 0
fi
echo "note: pip found no CPU build of torch ($TORCH_VERSION; TORCH_INDEX=$TORCH_INDEX);" \
  "installing Debian's python3-torch for the job instead" >&2
if "$(dirname "$0")/ensure-packages.sh" python3-torch libopenblas0 && has_torch /usr/bin/python3; then
  exit 0
fi
echo "warning: no torch: ml-training trains its numpy fallback, the pytorch benchmark" \
  "refuses to run (set TORCH_INDEX to an index with CPU wheels, or install torch)" >&2
