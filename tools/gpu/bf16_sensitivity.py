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
  - the median row's max |diff| (robust to a flipped near-tie);
  - for a hybrid (Qwen3.5) checkpoint, whose bf16 routes flip within the first rows and whose
    recurrent state then carries the flip to every later row, also the same max |diff| with the
    fixture's forced routes (p<i>_forced_routes.npy) replacing routing in both precisions:
    nothing can flip, so it is rounding alone over every row, the yardstick for the forced-routes
    test (first checked: the forced block with free routing reproduces the float64 model).
Writes JSON to argv[1] (default /tmp/bf16_sensitivity.json) and prints a table.
"""
import glob
import json
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from forced_moe import ForcedMoe  # (tools/gpu/forced_moe.py)

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


def forced_logits(model, cfg, top_k, ids, routes, device):
    """The model's logits with its MoE blocks swapped for ForcedMoe (routes None: free),
    the original blocks restored after."""
    originals = {}
    for i, layer in enumerate(model.model.layers):
        block = getattr(layer, "mlp", None)
        if block is None or not hasattr(block, "gate") or not hasattr(block, "experts"):
            continue
        with torch.no_grad():
            probe = block(torch.zeros(1, 1, int(cfg["hidden_size"]), dtype=block.gate.weight.dtype,
                                      device=block.gate.weight.device))
        forced = ForcedMoe(block, top_k, bool(cfg.get("norm_topk_prob", True)),
                           int(cfg["moe_intermediate_size"]), isinstance(probe, tuple))
        if routes is not None:
            forced.forced = torch.tensor(routes[:, i, :], dtype=torch.long)
        originals[i] = block
        layer.mlp = forced
    try:
        with torch.no_grad():
            return model(torch.tensor([ids], device=device)).logits[0].double().cpu().numpy()
    finally:
        for i, block in originals.items():
            model.model.layers[i].mlp = block


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
        text_config = config.get("text_config", config)
        hybrid = "linear_attention" in (text_config.get("layer_types") or [])
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
            record = {
                "rows": len(ids),
                "max_all": float(rows.max()),
                "median_row": float(np.median(rows)),
                "first_flip_row": flip,
                "max_before_flip": float(rows[:flip].max()) if flip else None,
                "logit_abs_max": float(np.abs(l64).max()),
            }
            routes_path = os.path.join(d, f"p{len(prompts)}_forced_routes.npy")
            if hybrid and os.path.exists(routes_path):
                try:
                    free = forced_logits(m64, text_config, top_k, ids, None, "cpu")
                    record["forced_block_free_max_abs_diff"] = float(np.abs(free - l64).max())
                    routes = np.load(routes_path)
                    f64 = forced_logits(m64, text_config, top_k, ids, routes, "cpu")
                    f16 = forced_logits(m16, text_config, top_k, ids, routes, device)
                    golden = np.load(os.path.join(d, f"p{len(prompts)}_forced_logits_all.npy"))
                    record["forced_vs_golden"] = float(np.abs(f64 - golden).max())
                    record["forced_max_all"] = float(np.abs(f16 - f64).max())
                    record["forced_logit_abs_max"] = float(np.abs(f64).max())
                except Exception as e:
                    record["forced_error"] = str(e)
            prompts.append(record)
        results[name] = {"prompts": prompts}
        ok = [p for p in prompts if "error" not in p]
        before = [p["max_before_flip"] for p in ok if p["max_before_flip"] is not None]
        print(f"{name:45s} bf16 vs f64: max (rows before a routing flip) {max(before) if before else float('nan'):.4f}, "
              f"max all rows {max(p['max_all'] for p in ok) if ok else float('nan'):.4f}, "
              f"median row {np.median([p['median_row'] for p in ok]) if ok else float('nan'):.4f}, "
              f"first flips {[p['first_flip_row'] for p in ok]}"
              + (f", forced routes: max {[p.get('forced_max_all') for p in ok]} (free-block check "
                 f"{[p.get('forced_block_free_max_abs_diff') for p in ok]}, vs golden "
                 f"{[p.get('forced_vs_golden') for p in ok]}, errors {[p.get('forced_error') for p in ok]})"
                 if hybrid else ""), flush=True)
        del m64, m16
    json.dump(results, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
