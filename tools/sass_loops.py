#!/usr/bin/env python3
"""The loops of a kernel in tools/sass.sh's output: each backward branch's target label to the
branch, with its instruction count and a histogram of the opcodes that matter for a memory-bound
loop (loads, stores, mma, FMA, moves, integer divisions' telltale I2F.U32.RP).

  tools/sass.sh src/backend/cuda/moe_fused.cu > /tmp/f.sass
  tools/sass_loops.py /tmp/f.sass fused_moe_kernelILi2ELb0
"""
import re
import sys
from collections import Counter

WATCH = ("LDG", "LDGSTS", "LDS", "STS", "STG", "HMMA", "FFMA", "IMAD.MOV", "I2F.U32.RP", "BRA",
         "SHFL", "BAR", "DEPBAR", "ACQBULK")


def kernel_lines(path, name):
    lines, inside = [], False
    for line in open(path):
        if line.startswith("//-----"):
            inside = name in line and ".text." in line
            continue
        if inside:
            lines.append(line.rstrip("\n"))
    return lines


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    lines = kernel_lines(sys.argv[1], sys.argv[2])
    if not lines:
        sys.exit(f"no kernel section matching {sys.argv[2]!r} in {sys.argv[1]}")
    instr = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_.]*)")
    label = re.compile(r"^(\.L_x_\d+):")
    branch = re.compile(r"BRA(?:\.[A-Z]+)?\s.*`\((\.L_x_\d+)\)")
    label_at, items = {}, []  # items: (address, opcode, text)
    for text in lines:
        m = label.match(text)
        if m:
            label_at[m.group(1)] = len(items)
            continue
        m = instr.match(text)
        if m:
            items.append((int(m.group(1), 16), m.group(2), text))
    print(f"{sys.argv[2]}: {len(items)} instructions")
    for i, (_, op, text) in enumerate(items):
        m = branch.search(text)
        if not m or m.group(1) not in label_at or label_at[m.group(1)] > i:
            continue
        start = label_at[m.group(1)]
        body = items[start:i + 1]
        ops = Counter()
        for _, o, _ in body:
            for w in WATCH:
                if o == w or o.startswith(w + "."):
                    ops[w] += 1
        summary = " ".join(f"{w}:{ops[w]}" for w in WATCH if ops[w])
        print(f"  loop {m.group(1)} at 0x{body[0][0]:x}..0x{body[-1][0]:x}: {len(body)} instructions; {summary}")


if __name__ == "__main__":
    main()
