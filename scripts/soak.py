#!/usr/bin/env python3
"""Soak test: N concurrent clients against a running `switchyard serve` (CPU, small model,
--enable-return-routed-experts, a KV cache small enough to force preemption) for a while, with
random client disconnects, aborts by id, flush_cache and update_weights_from_disk mid-flight.

Every completed request's tokens and routes must equal the same request run alone (measured
first, one at a time); every failure must be an OpenAI-shaped error that names why; nothing may
be lost (no answer within the timeout). Afterwards the server must be alive with its KV blocks
back to the baseline. Prints a JSON report; exits 1 if any check fails.
Standard library only: python3 scripts/soak.py --port P --model-dir D [--clients 64] [--seconds 600]
"""
import argparse
import http.client
import json
import random
import re
import socket
import sys
import threading
import time


def call(port, method, path, body=None, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        payload = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, payload, headers)
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        conn.close()


def metrics(port):
    _, text = call(port, "GET", "/metrics")
    values = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})?\s+([-0-9.eE+]+)$", line)
        if m and m.group(1) not in values:
            values[m.group(1)] = float(m.group(3))
    return values


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def shaped_error(text):
    try:
        error = json.loads(text)["error"]
        return isinstance(error["message"], str) and error["message"] != "" and "type" in error and "code" in error
    except Exception:
        return False


def request_body(prompt, max_tokens, rid=None):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_routed_experts": True, "return_token_ids": True}
    if rid:
        body["request_id"] = rid
    return body


def outcome(text):
    choice = json.loads(text)["choices"][0]
    return choice.get("token_ids") or choice.get("text"), choice.get("routed_experts"), choice.get("finish_reason")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pid", type=int, default=0, help="server pid, for RSS")
    parser.add_argument("--model-dir", required=True, help="for update_weights_from_disk (same weights)")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    port = args.port

    # A fixed set of requests (token-id prompts, some sharing prefixes), each run alone first.
    shared = [rng.randrange(1, 500) for _ in range(40)]
    cases = []
    for i in range(args.prompts):
        tail = [rng.randrange(1, 500) for _ in range(rng.randrange(3, 120))]
        prompt = (shared + tail) if i % 3 == 0 else tail
        cases.append((prompt, rng.randrange(4, 48)))
    reference = []
    for prompt, max_tokens in cases:
        status, text = call(port, "POST", "/v1/completions", request_body(prompt, max_tokens))
        if status != 200:
            print(f"reference run failed: {status} {text}", file=sys.stderr)
            return 1
        reference.append(outcome(text)[:2])
    time.sleep(0.5)
    baseline = metrics(port)
    baseline_rss = rss_kb(args.pid) if args.pid else -1

    lock = threading.Lock()
    counts = {"served": 0, "mismatch": 0, "aborted": 0, "disconnected": 0, "lost": 0, "bad_error": 0,
              "flush_cache": 0, "update_weights": 0}
    failed = {}  # reason -> count
    mismatches = []
    deadline = time.time() + args.seconds
    live_rids = []

    def bump(key, n=1):
        with lock:
            counts[key] += n

    def client(index):
        local = random.Random(args.seed * 1000 + index)
        serial = 0
        while time.time() < deadline:
            serial += 1
            case = local.randrange(len(cases))
            prompt, max_tokens = cases[case]
            action = local.random()
            rid = f"soak-{index}-{serial}"
            body = request_body(prompt, max_tokens, rid)
            if action < 0.08:  # disconnect: send the request and hang up at once or soon after
                try:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
                    payload = json.dumps(body).encode()
                    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
                    time.sleep(local.random() * 0.05)
                    sock.close()
                    bump("disconnected")
                except OSError as e:
                    with lock:
                        failed[f"client socket: {e}"] = failed.get(f"client socket: {e}", 0) + 1
                continue
            if action < 0.16:
                with lock:
                    live_rids.append(rid)
            try:
                status, text = call(port, "POST", "/v1/completions", body, timeout=300)
            except (socket.timeout, TimeoutError):
                bump("lost")
                continue
            except Exception as e:  # connection refused or reset: the server is in trouble
                with lock:
                    failed[f"transport: {type(e).__name__}"] = failed.get(f"transport: {type(e).__name__}", 0) + 1
                continue
            if status == 200:
                tokens, routes, finish = outcome(text)
                if finish == "abort":
                    bump("aborted")
                elif (tokens, routes) == reference[case]:
                    bump("served")
                else:
                    bump("mismatch")
                    with lock:
                        mismatches.append({"case": case, "finish_reason": finish})
            else:
                if not shaped_error(text):
                    bump("bad_error")
                reason = f"{status}: " + (json.loads(text)["error"]["message"][:80] if shaped_error(text) else text[:80])
                with lock:
                    failed[reason] = failed.get(reason, 0) + 1

    rss_samples = []  # (seconds since start, kB), every ~10 s: growth shows as a trend

    def chaos():
        local = random.Random(args.seed + 7)
        next_sample = time.time()
        while time.time() < deadline:
            if args.pid and time.time() >= next_sample:
                rss_samples.append((round(time.time() - started), rss_kb(args.pid)))
                next_sample += 10
            time.sleep(local.uniform(0.05, 0.3))
            with lock:
                rid = live_rids.pop(local.randrange(len(live_rids))) if live_rids else None
            if rid:
                call(port, "POST", "/abort_request", {"rid": rid})  # 404 when already finished: fine
            roll = local.random()
            if roll < 0.1:
                status, _ = call(port, "POST", "/flush_cache", {})
                bump("flush_cache") if status == 200 else None
            elif roll < 0.15:
                status, text = call(port, "POST", "/update_weights_from_disk", {"model_path": args.model_dir}, timeout=300)
                if status == 200:
                    bump("update_weights")
                else:
                    with lock:
                        failed[f"update_weights {status}"] = failed.get(f"update_weights {status}", 0) + 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    threads.append(threading.Thread(target=chaos))
    started = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.time() - started

    # Settle: the KV blocks in use go back to the baseline (nothing in flight).
    after = metrics(port)
    for _ in range(100):
        if after.get("switchyard:kv_blocks_used", -1) == baseline.get("switchyard:kv_blocks_used", -2):
            break
        time.sleep(0.1)
        after = metrics(port)
    health, _ = call(port, "GET", "/health")
    final_rss = rss_kb(args.pid) if args.pid else -1
    report = {
        "seed": args.seed, "clients": args.clients, "seconds": round(elapsed, 1), "counts": counts,
        "failed_by_reason": failed, "mismatches": mismatches[:10],
        "preemptions": after.get("vllm:num_preemptions_total", 0) - baseline.get("vllm:num_preemptions_total", 0),
        "kv_blocks_used": {"baseline": baseline.get("switchyard:kv_blocks_used"), "after": after.get("switchyard:kv_blocks_used")},
        "running_after": after.get("vllm:num_requests_running"), "waiting_after": after.get("vllm:num_requests_waiting"),
        "rss_kb": {"baseline": baseline_rss, "after": final_rss, "during": rss_samples}, "health_after": health,
    }
    print(json.dumps(report, indent=2))
    ok = (health == 200 and counts["lost"] == 0 and counts["mismatch"] == 0 and counts["bad_error"] == 0
          and counts["served"] > 0 and after.get("switchyard:kv_blocks_used") == baseline.get("switchyard:kv_blocks_used")
          and after.get("vllm:num_requests_running") == 0
          and not any(k.startswith("transport") or k.startswith("client socket") for k in failed))
    print("soak: " + ("PASS" if ok else "FAIL") + f" (rerun with --seed {args.seed})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
