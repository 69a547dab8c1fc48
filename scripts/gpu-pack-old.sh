#!/usr/bin/env bash
# Builds step_bench at earlier commits for gpu-check's binary A/B (`bin-ab`, BIN_AB) and puts
# each beside the current pack: gpu-carry/step_bench_<commit>.xz (stripped, executable, as
# gpu-pack.sh packs its own). Run after scripts/gpu-pack.sh. One git worktree (../sy-old-build,
# reused; its build folder too, so consecutive commits rebuild only what changed).
#   scripts/gpu-pack-old.sh ea2c7d6 a29c91a      then on the device:
#   BIN_AB="step_bench_ea2c7d6 step_bench_a29c91a step_bench" scripts/gpu-check.sh ceilings bin-ab
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[[ $# -gt 0 ]] || { echo "usage: $0 COMMIT..." >&2; exit 2; }
[[ -d gpu-carry ]] || { echo "$0: run scripts/gpu-pack.sh first (no gpu-carry/)" >&2; exit 1; }
tree=${OLD_TREE:-$root/../sy-old-build}
[[ -d $tree ]] || git worktree add --detach "$tree" HEAD >/dev/null
for commit in "$@"; do
  short=$(git rev-parse --short "$commit")
  git -C "$tree" checkout -q --detach "$short"
  # The same configuration as gpu-pack.sh's build-gpu.
  cmake -S "$tree" -B "$tree/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSWITCHYARD_NATIVE=OFF \
    -DSWITCHYARD_MARCH=x86-64-v3 -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DSWITCHYARD_MPI=OFF \
    -DSWITCHYARD_CUDA_ARCHITECTURES="${GPU_PACK_CUDA_ARCHS:-90a-real}" >/dev/null
  ninja -C "$tree/build-gpu" -j "${JOBS:-$(nproc)}" step_bench >/dev/null
  strip -o "gpu-carry/step_bench_$short" "$(find "$tree/build-gpu" -name step_bench -type f -perm -u+x | head -1)"
  chmod +x "gpu-carry/step_bench_$short"
  xz -T0 -6 -f "gpu-carry/step_bench_$short"  # keeps the mode: unpacks executable
  echo "gpu-carry/step_bench_$short.xz"
done
du -sh gpu-carry
