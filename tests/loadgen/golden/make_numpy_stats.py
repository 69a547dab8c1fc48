#!/usr/bin/env python3
"""Goldens for switchyard bench's statistics: numpy's mean, median, std and percentile (the
functions `vllm bench serve` reports with) on arrays shaped like latency samples.

Run on the GPU machine (which has numpy):  python3 tests/loadgen/golden/make_numpy_stats.py OUT.json
The committed output is tests/loadgen/golden/numpy_stats.json; stats_test.cpp reads it.
"""
import json
import platform
import sys

import numpy as np

PERCENTILES = [0, 1, 5, 10, 25, 33.3, 50, 66.7, 75, 90, 95, 99, 99.9, 100]


def cases():
    rng = np.random.default_rng(20240601)
    yield "one", [0.125]
    yield "two", [3.0, 1.0]
    yield "three_ties", [2.0, 2.0, 2.0]
    yield "four", [4.0, 1.0, 3.0, 2.0]
    yield "five_ints", [10.0, 20.0, 30.0, 40.0, 50.0]
    yield "ties_and_gaps", [1.0, 1.0, 1.0, 5.0, 5.0, 9.0, 100.0]
    for n in (10, 17, 100, 1001):
        yield f"uniform_{n}", rng.uniform(0.0, 0.5, n).tolist()
        yield f"exponential_{n}", rng.exponential(0.02, n).tolist()  # ITL-like
        yield f"lognormal_{n}", rng.lognormal(-3.0, 1.0, n).tolist()  # heavy tail, like TTFT
    yield "huge_and_tiny", [1e-9, 3e-9, 2.5e3, 7.0, 1e6]
    yield "quantized_ms", (np.round(rng.uniform(0, 0.05, 257), 3)).tolist()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "numpy_stats.json"
    records = []
    for name, values in cases():
        array = np.asarray(values, dtype=np.float64)
        records.append({
            "name": name,
            "values": [float(v) for v in array],
            "mean": float(np.mean(array)),
            "median": float(np.median(array)),
            "std": float(np.std(array)),
            "percentiles": {repr(float(p)) if p != int(p) else str(int(p)):
                            float(np.percentile(array, p)) for p in PERCENTILES},
        })
    document = {
        "generator": "tests/loadgen/golden/make_numpy_stats.py",
        "numpy": np.__version__,
        "python": platform.python_version(),
        "cases": records,
    }
    with open(out, "w") as f:
        json.dump(document, f, indent=1)
    print(f"numpy {np.__version__}, python {platform.python_version()}: {len(records)} cases -> {out}")


if __name__ == "__main__":
    main()
