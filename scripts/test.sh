#!/usr/bin/env bash
# Runs every test: Release build + all tests (unit and load), ASan+UBSan build + unit tests (load
# tests are Release-only),
# each libFuzzer target for ~30 s, and a compile of the CUDA backend when nvcc is present.
# Usage: scripts/test.sh   (after scripts/setup.sh)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=${JOBS:-$(nproc)}
fuzz_seconds=${FUZZ_SECONDS:-30}
section() { echo; echo "=== $* ($(date +%T))"; }
# A compiler cache where scripts/setup.sh installed one: a second run (CI on a machine that
# already built this tree) recompiles only what changed. Paths under the checkout are hashed
# relative to it, so another clone of the same commit hits too.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
    -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi

section "Release build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSWITCHYARD_CUDA=OFF "${launcher[@]}" >/dev/null  # CUDA: its own build below
ninja -C build -j "$jobs"
section "Release tests (all)"
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 600

section "ASan+UBSan build"
# -O1 -g1 (line tables): a third of -O2 -g's compile time under the sanitizers (measured on
# src/server/api.cpp: 40 s against 128 s of CPU), and stack traces keep their lines.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSWITCHYARD_SANITIZE=ON \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DSWITCHYARD_BENCH=OFF -DSWITCHYARD_CUDA=OFF \
  "${launcher[@]}" >/dev/null
ninja -C build-asan -j "$jobs"
section "ASan+UBSan unit tests"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -L unit -E '(ServeE2E\.Load|^Load\.)' --timeout 900

section "libFuzzer targets"
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-14 \
  -DCMAKE_CXX_COMPILER=clang++-14 -DSWITCHYARD_FUZZ=ON -DSWITCHYARD_TESTS=OFF -DSWITCHYARD_BENCH=OFF \
  -DSWITCHYARD_CUDA=OFF "${launcher[@]}" >/dev/null
targets=()
for src in fuzz/*_fuzz.cpp; do targets+=("$(basename "$src" .cpp)"); done
ninja -C build-fuzz -j "$jobs" "${targets[@]}"
fuzz_failed=0
for target in "${targets[@]}"; do
  corpus="fuzz/corpus/${target%_fuzz}"
  work=$(mktemp -d)
  [[ -d $corpus ]] && cp -r "$corpus/." "$work/"
  echo "fuzzing $target for ${fuzz_seconds}s"
  if ! UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "./build-fuzz/fuzz/$target" -max_total_time="$fuzz_seconds" -rss_limit_mb=4096 "$work" \
      > "build-fuzz/$target.log" 2>&1; then
    echo "FUZZ FAILURE: $target"; tail -40 "build-fuzz/$target.log"; fuzz_failed=1
  else
    grep -E "^Done|#[0-9]+.*DONE" "build-fuzz/$target.log" | tail -1 || true
  fi
  rm -rf "$work"
done
[[ $fuzz_failed == 0 ]] || exit 1

if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  # No GPU here: the CUDA backend, the CLI with it, the GPU bench and the op harness must compile
  # and link; they run on the GPU machine (scripts/gpu-pack.sh + scripts/gpu-check.sh).
  section "CUDA backend compile"
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
    -DSWITCHYARD_BENCH=ON "${launcher[@]}" >/dev/null
  ninja -C build-cuda -j "$jobs" switchyard step_bench cuda_op_harness
  # It must start and say plainly that this machine has no GPU (not crash, not hang).
  said=$(timeout 120 ./build-cuda/switchyard generate --device cuda \
    --model "$root/tests/golden/hf_qwen3_moe/qwen3moe_sparse_step" --prompt-ids 1,2,3 2>&1 || true)
  if grep -q "no CUDA device" <<< "$said"; then
    echo "CUDA build: runs, and says plainly that this machine has no GPU"
  else
    echo "CUDA build: expected 'no CUDA device', got:"; tail -20 <<< "$said"; exit 1
  fi
fi
echo
echo "all tests passed"
