#!/usr/bin/env python3
"""Benchmark records (issue 12's JSON fields) from a scripts/gpu-check.sh log, for a visit whose
JSON files did not come back from the device (its upload back has a file-count limit).

    tools/gpu/records_from_log.py LOG DATE OUT.json

Reads the step bench lines (decode / prefill / capture ratio) of the 8-layer cut and the full
model and the two throughput summaries; writes a list of records with date, commit, machine,
model, metric, value, floor, fraction and the command that produced the figure."""
import json
import re
import sys

log_path, date, out_path = sys.argv[1:4]
text = open(log_path).read()
commit = re.search(r"binaries built from commit (\S+)", text).group(1)
machine = re.search(r"^(NVIDIA [^,]+)", text, re.M).group(1)
records = []


def add(model, metric, value, floor=None, fraction=None, command=""):
    records.append({"date": date, "commit": commit, "machine": machine, "model": model, "metric": metric,
                    "value": round(value, 6), "floor": floor,
                    "fraction": None if fraction is None else round(fraction, 6), "command": command})


bench_cmd = ("step_bench --device cuda --random-weights {cfg} --batches {b} --context 1024 --steps 32 "
             "--prefill 8192 --bandwidth-gbs <ceilings> --matmul-tflops <ceilings>")
for section, model, cfg, batches in (("8-layer cut", "qwen3-30b-a3b-8l", "qwen3-30b-a3b-8l/config.json", "1,8,64"),
                                     ("full (48 layers)", "qwen3-30b-a3b", "qwen3-30b-a3b/config.json", "1,64")):
    body = text.split(f"=== step bench: Qwen3-30B-A3B {section}")[1].split("\n=== ")[0]
    cmd = bench_cmd.format(cfg=cfg, b=batches)
    for m in re.finditer(r"decode batch +(\d+) context +\d+: ([\d.]+) ms/step, ([\d.]+) tok/s;.*floor ([\d.]+) ms -> "
                         r"([\d.]+)% of floor\n  capture on/off step-time ratio: median ([\d.]+) \(p10 ([\d.]+), "
                         r"p90 ([\d.]+)\)", body):
        batch, ms, toks, floor_ms, pct, med, p10, p90 = m.groups()
        name = f"decode_b{batch}_tok_s"
        add(model, name, float(toks), {"step_ms": float(floor_ms)}, float(pct) / 100, cmd)
        add(model, f"capture_overhead_frac_b{batch}", float(med) - 1,
            None, None, cmd + f" (ABBA pairs; p10 {float(p10) - 1:+.4f}, p90 {float(p90) - 1:+.4f})")
    m = re.search(r"prefill (\d+) tokens: ([\d.]+) ms, (\d+) tok/s, ([\d.]+) TFLOP/s; floor ([\d.]+) ms -> ([\d.]+)%",
                  body)
    if m:
        add(model, "prefill_tok_s", float(m.group(3)), {"ms": float(m.group(5))}, float(m.group(6)) / 100, cmd)
for label, profile in (("1024 in / 128 out x 1000", "1024/128x1000"), ("1024 in / 512 out x 500", "1024/512x500")):
    parts = text.split(label)
    if len(parts) < 2:
        continue
    body = parts[1].split("\n=== ")[0]
    total = float(re.search(r"Total token throughput \(tok/s\): +([\d.]+)", body).group(1))
    output = float(re.search(r"Output token throughput \(tok/s\): +([\d.]+)", body).group(1))
    failed = int(re.search(r"Failed requests: +(\d+)", body).group(1))
    cmd = (f"switchyard bench --endpoint completions --input-len {profile.split('/')[0]} "
           f"--output-len {profile.split('/')[1].split('x')[0]} --num-prompts {profile.split('x')[1]} "
           "--ignore-eos --routed-experts against serve --device cuda --max-num-seqs 256 --max-num-batched-tokens 8192")
    add("qwen3-30b-a3b", f"throughput_total_tok_s[{profile}]", total, None, None, cmd + f" (failed {failed})")
    add("qwen3-30b-a3b", f"throughput_output_tok_s[{profile}]", output, None, None, cmd)
json.dump(records, open(out_path, "w"), indent=1)
print(f"{len(records)} records -> {out_path}")
