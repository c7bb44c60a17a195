#!/usr/bin/env bash
# Install NVIDIA Dynamo's frontend, KV router and GPU-free mocker workers once into their own
# virtual environment outside the clone, so later runs (and CI on the same machine) reuse it;
# prints the path of that environment's python.
#
#   engines/dynamo/install.sh          # about 2 minutes and 690 MB the first time
#
# `pip install ai-dynamo` fails without a GPU vendor's registry: it depends on `aisimulate`, a
# placeholder whose install downloads from a registry outside PyPI, which the frontend and the
# mocker never import (only Dynamo's planner and offline replay do). So the ai-dynamo wheel is
# installed without its dependencies, then those of its metadata but aisimulate (no torch, no
# CUDA), and the runtime wheel (the Rust core) with its own. KVBENCH_ENGINE_CACHE overrides the
# cache folder (default /var/cache/kvbench).
set -euo pipefail
VERSION=1.6.1
CACHE=${KVBENCH_ENGINE_CACHE:-/var/cache/kvbench}
PREFIX=$CACHE/dynamo-$VERSION
PY=$PREFIX/bin/python
CHECK="import dynamo.frontend, dynamo.mocker, tokenizers"
if [ -x "$PY" ] && "$PY" -c "$CHECK" >/dev/null 2>&1; then
  echo "$PY"
  exit 0
fi
rm -rf "$PREFIX"
mkdir -p "$CACHE"
WORK=$(mktemp -d "$CACHE/dynamo-install.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
python3 -m venv "$PREFIX"
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps \
  "ai-dynamo==$VERSION" "ai-dynamo-runtime==$VERSION" -d "$WORK" >&2
WHEEL=$(ls "$WORK"/ai_dynamo-"$VERSION"-*.whl)
"$PY" "$(dirname "$0")/../requires.py" "$WHEEL" aisimulate ai-dynamo-runtime > "$WORK/requirements.txt"
"$PY" -m pip install --quiet --disable-pip-version-check "$WORK"/ai_dynamo_runtime-"$VERSION"-*.whl >&2
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps "$WHEEL" >&2
# tokenizers: to train the tiny model's tokenizer (engines/dynamo/make_model.py)
"$PY" -m pip install --quiet --disable-pip-version-check -r "$WORK/requirements.txt" tokenizers >&2
"$PY" -c "$CHECK" >&2
echo "$PY"
