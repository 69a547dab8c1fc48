#!/usr/bin/env bash
# Builds Switchyard (Release), makes the built-in default model (models/tiny) if it is missing,
# and generates from text with the routed experts of every token written to routes.npy.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build switchyard
[[ -f models/tiny/config.json ]] || ./build/switchyard make-model --preset tiny --out models/tiny
./build/switchyard generate --model models/tiny --prompt "The capital of France is" --max-tokens 16 \
  --seed 0 --routes-out routes.npy
