#!/usr/bin/env bash
# Builds Switchyard (Release), makes the built-in default model (models/tiny) if it is missing,
# (1) generates from text with the routed experts of every token written to routes.npy, then
# (2) starts `switchyard serve` on it, sends one chat request, and prints the reply and the shape
# of its routed experts.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build switchyard
bin=./build/switchyard
[[ -f models/tiny/config.json ]] || $bin make-model --preset tiny --out models/tiny

echo "--- generate"
$bin generate --model models/tiny --prompt "The capital of France is" --max-tokens 16 --seed 0 --routes-out routes.npy

echo "--- serve + one chat request"
log=$(mktemp)
$bin serve --model models/tiny --port 0 --enable-return-routed-experts --return-routed-experts-default >"$log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$log"' EXIT
url=""
for _ in $(seq 1 300); do
  url=$(grep -o 'http://[0-9.]*:[0-9]*' "$log" | head -1 || true)
  if [[ -n $url ]] && curl -sf "$url/health" >/dev/null; then break; fi
  sleep 0.1
done
[[ -n $url ]] || { cat "$log"; exit 1; }
curl -sf "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "models/tiny", "messages": [{"role": "user", "content": "Name three rivers."}], "max_tokens": 16, "seed": 0}' |
  node -e '
    let body = ""; process.stdin.on("data", d => body += d).on("end", () => {
      const choice = JSON.parse(body).choices[0];
      console.log("reply:", JSON.stringify(choice.message.content));
      const npy = Buffer.from(choice.routed_experts, "base64");
      const header = npy.subarray(10, 10 + npy.readUInt16LE(8)).toString();
      console.log("routed_experts:", header.match(/descr.: .([^\x27]*)/)[1], "shape", header.match(/shape.: (\([^)]*\))/)[1]);
    });'
