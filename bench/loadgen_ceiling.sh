#!/usr/bin/env bash
# The load generator's own ceiling: `switchyard bench` against bench/trivial_server (no model), on
# loopback, in three profiles:
#   requests  - tiny requests (1 token each) through 64 connections: requests/s the client sustains
#   tokens    - 1,000-token streams, 100 at a time, unpaced: streamed tokens/s
#   streams   - N streams at once, the server pacing a token every STREAM_INTERVAL_MS: are they all
#               held, and does ITL stay at the interval (the client keeping up) rather than growing?
# Usage: bench/loadgen_ceiling.sh BIN_DIR OUT.json [MACHINE_LABEL]
#   BIN_DIR holds `switchyard` and `trivial_server`. Env: SERVER_THREADS (default 1), STREAMS
#   (default 2000), STREAM_INTERVAL_MS (default 100), COMMIT (default: git rev-parse HEAD).
#   Everything stays on 127.0.0.1.
set -euo pipefail
bin=$(cd "$1" && pwd)
out=$2
label=${3:-$(hostname)}
server_threads=${SERVER_THREADS:-1}
streams=${STREAMS:-2000}
stream_interval_ms=${STREAM_INTERVAL_MS:-100}
commit=${COMMIT:-$(git -C "$(dirname "$0")" rev-parse HEAD 2>/dev/null || echo unknown)}
work=$(mktemp -d)
port=18300
server_pid=

stop_server() {
  if [[ -n $server_pid ]]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=
  fi
}
trap stop_server EXIT

run_profile() {  # name, server args, bench args...
  local name=$1 server_args=$2
  shift 2
  port=$((port + 1))
  # shellcheck disable=SC2086
  "$bin/trivial_server" --port "$port" --threads "$server_threads" --duration-s 300 $server_args \
    >"$work/$name.server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 50); do grep -q listening "$work/$name.server.log" 2>/dev/null && break; sleep 0.1; done
  echo "== $name: $*"
  "$bin/switchyard" bench --base-url "http://127.0.0.1:$port" --model stub --vocab-size 1000 \
    --no-progress --result-file "$work/$name.json" "$@" | grep -E "Successful|Failed|duration|throughput|Peak|ITL|CPU"
  stop_server
}

run_profile requests "" --input-len 16 --output-len 1 --num-prompts 20000 --max-concurrency 64
run_profile tokens "" --input-len 16 --output-len 1000 --num-prompts 400 --max-concurrency 100
run_profile streams "--token-interval-ms $stream_interval_ms" --input-len 16 --output-len 50 \
  --num-prompts "$streams"

python3 - "$work" "$out" "$label" "$commit" "$server_threads" "$stream_interval_ms" <<'EOF'
import json, os, platform, sys, time
work, out, label, commit, server_threads, stream_interval_ms = sys.argv[1:7]
keep = ["completed", "failed", "duration", "request_throughput", "output_throughput",
        "max_output_tokens_per_s", "max_concurrent_requests", "peak_open_streams", "client_cpu_s",
        "client_cpu_percent", "mean_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "median_itl_ms",
        "p90_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms"]
def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
profiles = {}
for name in ("requests", "tokens", "streams"):
    result = json.load(open(os.path.join(work, name + ".json")))
    record = {key: result.get(key) for key in keep}
    # What one client core could do if the server were free: the work done per client CPU second.
    if result.get("client_cpu_s"):
        record["requests_per_client_cpu_s"] = result["completed"] / result["client_cpu_s"]
        record["tokens_per_client_cpu_s"] = result["total_output_tokens"] / result["client_cpu_s"]
    profiles[name] = record
document = {
    "what": "switchyard bench against bench/trivial_server on 127.0.0.1 (bench/loadgen_ceiling.sh)",
    "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    "commit": commit,
    "machine": {"label": label, "cpu": cpu_model(), "cores": os.cpu_count(),
                "kernel": platform.release()},
    "client": "one process, one thread (Boost.Asio coroutines)",
    "server_threads": int(server_threads),
    "stream_token_interval_ms": float(stream_interval_ms),
    "fd_limit_hard": __import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE)[1],
    "profiles": profiles,
}
existing = {}
if os.path.exists(out):
    try:
        existing = json.load(open(out))
    except ValueError:
        existing = {}
runs = existing.get("runs", []) if isinstance(existing, dict) else []
runs = [run for run in runs if run.get("machine", {}).get("label") != label] + [document]
json.dump({"runs": runs}, open(out, "w"), indent=1)
print(f"wrote {out} ({label})")
EOF
rm -rf "$work"
