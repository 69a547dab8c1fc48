#!/usr/bin/env python3
"""Per-kernel table of one step from an ncu --csv log (gpu__time_duration.sum, dram__bytes_*).

The last step is the kernels from the last embedding launch to the end of the log. Prints each
kernel name's launches, total microseconds, share of the step, DRAM bytes and achieved GB/s, and
writes the same as JSON next to the CSV.
  ncu_table.py ncu_decode.csv --last-step decode [--bandwidth-gbs B]
"""
import argparse, csv, json, re, sys
from collections import OrderedDict

ap = argparse.ArgumentParser()
ap.add_argument("csv")
ap.add_argument("--last-step", default="step")
ap.add_argument("--bandwidth-gbs", type=float, default=0.0)
args = ap.parse_args()

rows = []
with open(args.csv, newline="") as f:
    lines = [l for l in f if l.startswith('"')]  # ncu's own messages are not quoted
for r in csv.DictReader(lines):
    rows.append(r)
if not rows:
    sys.exit(f"{args.csv}: no kernel rows (did ncu run?)")

kernels = OrderedDict()  # ID -> {name, metrics}
for r in rows:
    k = kernels.setdefault(r["ID"], {"name": r["Kernel Name"], "grid": r.get("Grid Size", ""),
                                     "block": r.get("Block Size", "")})
    value = r["Metric Value"].replace(",", "")
    unit = r["Metric Unit"]
    try:
        v = float(value)
    except ValueError:
        continue
    scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6,
             "ns": 1e-3, "us": 1.0, "ms": 1e3, "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1.0)
    k[r["Metric Name"]] = v * scale

ids = list(kernels)
starts = [i for i, kid in enumerate(ids) if "embedding" in kernels[kid]["name"]]
first = starts[-1] if starts else 0
step = [kernels[kid] for kid in ids[first:]]

def short(name):
    for noise in ("<unnamed>::", "(anonymous namespace)::", "void "):
        name = name.replace(noise, "")
    name = name.split("(")[0]
    return re.sub(r"^(sy|cuda|cub)::", "", name).strip()

table = OrderedDict()
for k in step:
    t = table.setdefault(short(k["name"]), {"launches": 0, "us": 0.0, "bytes": 0.0})
    t["launches"] += 1
    t["us"] += k.get("gpu__time_duration.sum", 0.0)
    t["bytes"] += k.get("dram__bytes_read.sum", 0.0) + k.get("dram__bytes_write.sum", 0.0)
total = sum(t["us"] for t in table.values())
print(f"{args.last_step}: {len(step)} kernels, {total:.1f} us of kernel time (sum of isolated durations)")
print(f"{'kernel':44s} {'n':>5s} {'us':>9s} {'share':>6s} {'MB':>9s} {'GB/s':>7s}" +
      (" {:>6s}".format("of bw") if args.bandwidth_gbs else ""))
for name, t in sorted(table.items(), key=lambda kv: -kv[1]["us"]):
    gbs = t["bytes"] / (t["us"] * 1e3) if t["us"] else 0.0
    line = f"{name[:44]:44s} {t['launches']:5d} {t['us']:9.1f} {100*t['us']/total:5.1f}% {t['bytes']/1e6:9.2f} {gbs:7.0f}"
    if args.bandwidth_gbs:
        line += f" {100*gbs/args.bandwidth_gbs:5.1f}%"
    print(line)
json.dump({"step": args.last_step, "kernels": len(step), "kernel_us": total, "table": table},
          open(re.sub(r"\.csv$", "", args.csv) + ".json", "w"), indent=1)
