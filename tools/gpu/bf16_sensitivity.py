#!/usr/bin/env python3
"""How far transformers itself moves each golden model's logits when it runs in bfloat16 instead
of float64: the yardstick for Switchyard's CUDA tolerance (CUDA rounds activations, attention's Q
and P, and the KV cache to bf16). A model whose bf16 run moves the logits five times as far as
another's may show five times the CUDA-vs-reference difference without any defect.

For every committed golden checkpoint folder (tests/golden/hf_*/*, bf16 safetensors; MXFP4 and
models transformers cannot load here are reported and skipped): load from disk twice (float64 on
the CPU, bfloat16 on the GPU), run each fixture prompt's sequence_ids, and report
  - max |logits_bf16 - logits_f64| over the rows before the first row whose routing differs
    (router top-k sets from output_router_logits, where the model returns them), and over all rows;
  - the median row's max |diff| (robust to a flipped near-tie).
Writes JSON to argv[1] (default /tmp/bf16_sensitivity.json) and prints a table.
"""
import glob
import json
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden")


def load(d, dtype, device):
    # The eager experts loop (transformers' default grouped_mm experts do not take float64), the
    # same algorithm in both precisions.
    error = None
    for kwargs in ({"experts_implementation": "eager"}, {}):
        try:
            return AutoModelForCausalLM.from_pretrained(d, dtype=dtype, attn_implementation="eager",
                                                        **kwargs).to(device).eval()
        except (TypeError, ValueError) as e:
            error = e
    raise error


def run(model, ids, device):
    with torch.no_grad():
        try:
            out = model(torch.tensor([ids], device=device), output_router_logits=True)
            routers = getattr(out, "router_logits", None)
        except Exception:  # a model without router logits output
            out = model(torch.tensor([ids], device=device))
            routers = None
    logits = out.logits[0].double().cpu().numpy()
    if routers is not None:
        routers = [r.double().cpu().numpy().reshape(len(ids), -1) for r in routers if r is not None]
    return logits, routers


def first_flip(r64, r16, top_k, n):
    if not r64 or not r16 or len(r64) != len(r16):
        return None
    first = n
    for a, b in zip(r64, r16):
        if a.shape != b.shape or a.shape[0] != n:
            return None
        ta = np.sort(np.argsort(-a, axis=1)[:, :top_k], axis=1)
        tb = np.sort(np.argsort(-b, axis=1)[:, :top_k], axis=1)
        differ = np.nonzero((ta != tb).any(axis=1))[0]
        if len(differ):
            first = min(first, int(differ[0]))
    return first


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else "/tmp/bf16_sensitivity.json"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = {}
    for d in sorted(glob.glob(os.path.join(ROOT, "hf_*", "*"))):
        name = os.path.relpath(d, ROOT)
        fixture_path = os.path.join(d, "fixture.json")
        config = json.load(open(os.path.join(d, "config.json")))
        if not os.path.exists(fixture_path) or "quantization_config" in config:
            continue
        fixture = json.load(open(fixture_path))
        try:
            m64 = load(d, torch.float64, "cpu")
            m16 = load(d, torch.bfloat16, device)
        except Exception as e:
            results[name] = {"error": f"load: {e}"}
            print(f"{name}: not loaded ({e})", flush=True)
            continue
        top_k = int(fixture.get("top_k", 2))
        prompts = []
        for p in fixture["prompts"]:
            ids = p["sequence_ids"]
            try:
                l64, r64 = run(m64, ids, "cpu")
                l16, r16 = run(m16, ids, device)
            except Exception as e:
                prompts.append({"error": str(e)})
                continue
            rows = np.abs(l16 - l64).max(axis=1)
            flip = first_flip(r64, r16, top_k, len(ids))
            prompts.append({
                "rows": len(ids),
                "max_all": float(rows.max()),
                "median_row": float(np.median(rows)),
                "first_flip_row": flip,
                "max_before_flip": float(rows[:flip].max()) if flip else None,
                "logit_abs_max": float(np.abs(l64).max()),
            })
        results[name] = {"prompts": prompts}
        ok = [p for p in prompts if "error" not in p]
        before = [p["max_before_flip"] for p in ok if p["max_before_flip"] is not None]
        print(f"{name:45s} bf16 vs f64: max (rows before a routing flip) {max(before) if before else float('nan'):.4f}, "
              f"max all rows {max(p['max_all'] for p in ok) if ok else float('nan'):.4f}, "
              f"median row {np.median([p['median_row'] for p in ok]) if ok else float('nan'):.4f}, "
              f"first flips {[p['first_flip_row'] for p in ok]}", flush=True)
        del m64, m16
    json.dump(results, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
