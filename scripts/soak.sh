#!/usr/bin/env bash
# Soak: `switchyard serve` on the CPU with a small model (the golden Qwen3-MoE fixture), route
# capture on and a KV cache small enough to force preemption, under scripts/soak.py's clients.
# Usage: scripts/soak.sh [SECONDS=600] [CLIENTS=64]   (after a Release build in build/)
# Env: SOAK_KV_TOKENS (default 2048), SOAK_SEED, SOAK_THREADS (engine threads, default 2),
# SOAK_BIN (the switchyard binary, default build/switchyard), SOAK_SERVE_ARGS (extra serve flags:
# "--device cuda --batch-invariant" for the CUDA soak; routes are compared with each request run
# alone, so CUDA needs the flag).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-600}
clients=${2:-64}
model="$root/tests/golden/hf_qwen3_moe/qwen3moe_dense_nonorm"
log=$(mktemp)
"${SOAK_BIN:-$root/build/switchyard}" serve --model "$model" --port 0 --enable-return-routed-experts --return-routed-experts-default \
  --kv-cache-tokens "${SOAK_KV_TOKENS:-2048}" --max-num-batched-tokens 256 --threads "${SOAK_THREADS:-2}" \
  --max-model-len 512 ${SOAK_SERVE_ARGS:-} >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -f "$log"' EXIT
port=""
for _ in $(seq 1 600); do
  port=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$log" | head -1)
  [[ -n $port ]] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
echo "soak: serve pid $server on port $port, $clients clients for ${seconds}s"
status=0
python3 "$root/scripts/soak.py" --port "$port" --pid "$server" --model-dir "$model" --clients "$clients" \
  --seconds "$seconds" ${SOAK_SEED:+--seed "$SOAK_SEED"} || status=$?
kill -0 "$server" 2>/dev/null || { echo "soak: the server died"; cat "$log"; exit 1; }
exit $status
