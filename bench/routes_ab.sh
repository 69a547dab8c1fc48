#!/usr/bin/env bash
# Cost of routed-expert capture: the same small random profile against `switchyard serve` (CPU by
# default; SERVE_ARGS="--device cuda" on the GPU machine) with routes on (A) and off (B),
# interleaved A/B/A/B for PAIRS pairs in one session.
#   A: serve --enable-return-routed-experts, bench --routed-experts (every payload checked)
#   B: serve without the flag,               bench --no-routed-experts
# The server restarts for every run, so A pays capture + encoding + transfer and B pays none.
# Reports each run's output tok/s, the A/B ratio per pair and its median, and the spread of
# same-vs-same pairs (A_i/A_i+1 and B_i/B_i+1): the target is |median - 1| within that spread and < 1%.
# With ARMS="on off capture", a third arm C per pair: capture on at the server, the client asks
# for no routes (capture alone, no payload). Each run also scrapes the server's /metrics before
# stopping it: the server-side mean TPOT and TTFT (no client time in them), and the engine thread's
# step time and the share of it spent on routes on the host (route_host_seconds_total).
# Usage: bench/routes_ab.sh [BUILD_DIR] [OUT.json]
#   Env: PAIRS (5), NUM_PROMPTS (16), INPUT_LEN (64), OUTPUT_LEN (32), CONCURRENCY (8), THREADS
#   (server compute threads, default: all cores), MODEL_DIR (default BUILD_DIR/ab-model: made with
#   make-model --preset qwen3-30b-a3b --layers 4 when missing), KV_TOKENS (KV cache size, 16384),
#   PORT (18400), BIN (the switchyard binary, default BUILD_DIR/switchyard), SERVE_ARGS (extra serve
#   flags), RANDOM_WEIGHTS (a config.json: serve --random-weights it instead of --model; its folder
#   must hold the tokenizer). Loopback only.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
out=${2:-$root/bench/results/routes_ab.json}
bin=${BIN:-$build/switchyard}
pairs=${PAIRS:-5}
num_prompts=${NUM_PROMPTS:-16}
input_len=${INPUT_LEN:-64}
output_len=${OUTPUT_LEN:-32}
concurrency=${CONCURRENCY:-8}
threads=${THREADS:-$(nproc)}
model=${MODEL_DIR:-$build/ab-model}
kv_tokens=${KV_TOKENS:-16384}
port=${PORT:-18400}
work=$(mktemp -d)
server_pid=

stop_server() {
  if [[ -n $server_pid ]]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=
  fi
}
trap 'stop_server; rm -rf "$work"' EXIT

model_args=(--model "$model")
if [[ -n ${RANDOM_WEIGHTS:-} ]]; then
  model=$(dirname "$RANDOM_WEIGHTS")
  model_args=(--random-weights "$RANDOM_WEIGHTS")
elif [[ ! -f $model/config.json ]]; then
  echo "making $model (qwen3-30b-a3b, 4 layers, random weights)"
  "$bin" make-model --preset qwen3-30b-a3b --layers 4 --out "$model"
fi

wait_healthy() {
  for _ in $(seq 600); do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then return 0; fi
    kill -0 "$server_pid" 2>/dev/null || { echo "server exited; log:"; cat "$work/server.log"; return 1; }
    sleep 0.2
  done
  echo "server not healthy after 120 s"; return 1
}

run_one() {  # label on|off|capture, index
  local side=$1 index=$2 serve_flags=() bench_flags=()
  if [[ $side == on ]]; then
    serve_flags=(--enable-return-routed-experts)
    bench_flags=(--routed-experts)
  elif [[ $side == capture ]]; then
    serve_flags=(--enable-return-routed-experts)
    bench_flags=(--no-routed-experts)
  else
    bench_flags=(--no-routed-experts)
  fi
  "$bin" serve "${model_args[@]}" --host 127.0.0.1 --port "$port" --threads "$threads" \
    --kv-cache-tokens "$kv_tokens" ${SERVE_ARGS:-} "${serve_flags[@]}" >"$work/server.log" 2>&1 &
  server_pid=$!
  wait_healthy
  "$bin" bench --base-url "http://127.0.0.1:$port" --tokenizer "$model" --endpoint completions \
    --prompt-format ids --input-len "$input_len" --output-len "$output_len" \
    --num-prompts "$num_prompts" --max-concurrency "$concurrency" --ignore-eos --seed 1 \
    --no-progress "${bench_flags[@]}" --result-file "$work/$side-$index.json" |
    grep -E "Successful|Failed|Output token throughput|Mean TTFT|Mean TPOT|Routes"
  curl -sf "http://127.0.0.1:$port/metrics" >"$work/$side-$index.metrics" || true
  stop_server
}

arms=${ARMS:-on off}
for i in $(seq "$pairs"); do
  for side in $arms; do
    echo "== pair $i: $side"
    run_one "$side" "$i"
  done
done

python3 - "$work" "$out" "$pairs" "$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)" \
  "$num_prompts" "$input_len" "$output_len" "$concurrency" "$threads" "${RANDOM_WEIGHTS:-$model}" "${SERVE_ARGS:-}" \
  "$arms" <<'EOF'
import json, os, platform, statistics, subprocess, sys, time
work, out, pairs, commit, num_prompts, input_len, output_len, concurrency, threads, model, serve_args, arms = sys.argv[1:13]
pairs = int(pairs)
arms = arms.split()
def load(side, i):
    return json.load(open(os.path.join(work, f"{side}-{i}.json")))
def counter(side, i, name):
    # A sample of the run's /metrics scrape (the server has one label set per metric), or None.
    try:
        for line in open(os.path.join(work, f"{side}-{i}.metrics")):
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.split()[-1])
    except OSError:
        pass
    return None
def server_mean(side, i, name):
    # Mean of a server histogram (_sum / _count), in ms.
    total, count = counter(side, i, name + "_sum"), counter(side, i, name + "_count")
    return 1000.0 * total / count if total is not None and count else None
on = [load("on", i) for i in range(1, pairs + 1)]
off = [load("off", i) for i in range(1, pairs + 1)]
tps = lambda runs: [r["output_throughput"] for r in runs]
ratios = [a / b for a, b in zip(tps(on), tps(off))]
same = [x / y for x, y in zip(tps(on), tps(on)[1:])] + [x / y for x, y in zip(tps(off), tps(off)[1:])]
spread = max(abs(r - 1) for r in same) if same else float("nan")
median_ratio = statistics.median(ratios)
doc = {
    "what": "routes on/off A/B against switchyard serve (bench/routes_ab.sh)", "serve_args": serve_args,
    "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "commit": commit,
    "machine": {"cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), ""),
                "cores": os.cpu_count(), "kernel": platform.release(),
                "gpu": subprocess.run(["sh", "-c", "nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null"],
                                      capture_output=True, text=True).stdout.strip()},
    "profile": {"model": model, "num_prompts": int(num_prompts),
                "input_len": int(input_len), "output_len": int(output_len),
                "max_concurrency": int(concurrency), "server_threads": int(threads), "ignore_eos": True},
    "on_output_tok_s": tps(on), "off_output_tok_s": tps(off),
    "on_mean_ttft_ms": [r["mean_ttft_ms"] for r in on], "off_mean_ttft_ms": [r["mean_ttft_ms"] for r in off],
    "on_mean_tpot_ms": [r["mean_tpot_ms"] for r in on], "off_mean_tpot_ms": [r["mean_tpot_ms"] for r in off],
    "routes_checked": sum(r.get("routes_checked", 0) for r in on),
    "routes_failed": sum(r.get("routes_failed", 0) for r in on),
    "failed_requests": sum(r["failed"] for r in on + off),
    "pair_ratios_on_over_off": ratios, "median_ratio": median_ratio,
    "same_vs_same_ratios": same, "same_vs_same_max_abs_deviation": spread,
    "within_spread": abs(median_ratio - 1) <= spread, "under_1_percent": abs(median_ratio - 1) < 0.01,
}
for side in arms:
    doc[f"{side}_server_mean_tpot_ms"] = [server_mean(side, i, "vllm:time_per_output_token_seconds") for i in range(1, pairs + 1)]
    doc[f"{side}_server_mean_ttft_ms"] = [server_mean(side, i, "vllm:time_to_first_token_seconds") for i in range(1, pairs + 1)]
    # The engine thread's own account: its step time, and the share spent on routes on the host.
    doc[f"{side}_engine_steps"] = [counter(side, i, "switchyard:engine_steps_total") for i in range(1, pairs + 1)]
    doc[f"{side}_engine_step_seconds"] = [counter(side, i, "switchyard:engine_step_seconds_total") for i in range(1, pairs + 1)]
    doc[f"{side}_route_host_fraction"] = [
        (r / t if r is not None and t else None)
        for r, t in zip([counter(side, i, "switchyard:route_host_seconds_total") for i in range(1, pairs + 1)],
                        doc[f"{side}_engine_step_seconds"])]
    print(f"{side}: engine step seconds {doc[f'{side}_engine_step_seconds']}, route host share {doc[f'{side}_route_host_fraction']}")
def ratios_of(a, b):
    return [x / y for x, y in zip(a, b) if x and y]
doc["server_tpot_ratios_on_over_off"] = ratios_of(doc["on_server_mean_tpot_ms"], doc["off_server_mean_tpot_ms"])
if "capture" in arms:
    cap = [load("capture", i) for i in range(1, pairs + 1)]
    doc["capture_output_tok_s"] = tps(cap)
    doc["pair_ratios_capture_over_off"] = [a / b for a, b in zip(tps(cap), tps(off))]
    doc["median_ratio_capture_over_off"] = statistics.median(doc["pair_ratios_capture_over_off"])
    doc["server_tpot_ratios_capture_over_off"] = ratios_of(doc["capture_server_mean_tpot_ms"], doc["off_server_mean_tpot_ms"])
    print(f"median capture-only/off output tok/s ratio {doc['median_ratio_capture_over_off']:.4f}; "
          f"server TPOT capture/off {doc['server_tpot_ratios_capture_over_off']}")
print(f"server-side mean TPOT on/off per pair {doc['server_tpot_ratios_on_over_off']}")
json.dump(doc, open(out, "w"), indent=1)
print(f"median on/off output tok/s ratio {median_ratio:.4f}; same-vs-same spread ±{spread:.4f}; "
      f"routes checked {doc['routes_checked']}, failed {doc['routes_failed']} -> {out}")
EOF
