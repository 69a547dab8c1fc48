#!/usr/bin/env python3
"""The loops of a kernel in tools/sass.sh's output: each backward branch's target label to the
branch, with its instruction count and a histogram of the opcodes that matter for a memory-bound
loop (loads, stores, mma, FMA, moves, integer divisions' telltale I2F.U32.RP).

  tools/sass.sh src/backend/cuda/moe_fused.cu > /tmp/f.sass
  tools/sass_loops.py /tmp/f.sass fused_moe_kernelILi2ELb0 [--all]

Innermost loops only (those containing no other loop) unless --all.
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
    args = [a for a in sys.argv[1:] if a != "--all"]
    show_all = len(args) != len(sys.argv) - 1
    if len(args) != 2:
        sys.exit(__doc__)
    sys.argv[1:3] = args
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
    loops = []  # (start, end, label)
    for i, (_, op, text) in enumerate(items):
        m = branch.search(text)
        if m and m.group(1) in label_at and label_at[m.group(1)] <= i:
            loops.append((label_at[m.group(1)], i, m.group(1)))
    for start, end, name in loops:
        inner = any(s >= start and e <= end and (s, e) != (start, end) for s, e, _ in loops)
        if inner and not show_all:
            continue
        body = items[start:end + 1]
        ops = Counter()
        for _, o, _ in body:
            for w in WATCH:
                if o == w or o.startswith(w + "."):
                    ops[w] += 1
        summary = " ".join(f"{w}:{ops[w]}" for w in WATCH if ops[w])
        print(f"  loop {name} at 0x{body[0][0]:x}..0x{body[-1][0]:x}: {len(body)} instructions; {summary}")


if __name__ == "__main__":
    main()
