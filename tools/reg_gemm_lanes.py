#!/usr/bin/env python3
"""Checks mxfp4_reg_gemm_kernel's lane mapping (moe_modular.cu) without a GPU: numpy plays the
m16n8k16 mma's fragments (PTX ISA: A rows g / g + 8 and k pairs 2q / 2q + 8 per lane, B k pairs
of column g, C rows g / g + 8 and columns 2q, 2q + 1), each lane's operands built the way the
kernel builds them (word q of each 32-value block decoded with mxfp4_f16x8_times_2m14's pair order,
x in the x16 order, two mma from zero per block scaled by the row's 2^(s - 127)), and compares the
result with W x computed directly. Prints the largest difference (float64 rounding only).
  python3 tools/reg_gemm_lanes.py   (needs numpy: Debian's python3-numpy)"""
import numpy as np

rng = np.random.default_rng(1)
E2M1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6]


def value(code):
    return (-1 if code & 8 else 1) * E2M1[code & 7]


K, ROWS, TOKENS = 96, 32, 16  # 3 blocks, two warps' rows, one M tile of two n8 fragments
packed = rng.integers(0, 256, size=(ROWS, K // 2), dtype=np.uint8)
scales = rng.integers(120, 130, size=(ROWS, K // 32))
W = np.array([[value((packed[r, i // 2] >> 4) if i & 1 else packed[r, i // 2] & 15) *
               2.0 ** (scales[r, i // 32] - 127) for i in range(K)] for r in range(ROWS)])
X = rng.standard_normal((TOKENS, K))
x16 = np.zeros_like(X)  # x16_slot: within each 8 values, 0 4 1 5 2 6 3 7
for i in range(K):
    x16[:, (i & ~7) | ((i & 3) << 1) | ((i >> 2) & 1)] = X[:, i]


def word_pairs(r, block, q):  # mxfp4_f16x8_times_2m14 without its 2^-14: word i = (e_i, e_{i+4})
    b = packed[r, block * 16 + 4 * q: block * 16 + 4 * q + 4]
    w = int(b[0]) | int(b[1]) << 8 | int(b[2]) << 16 | int(b[3]) << 24
    e = [value((w >> (4 * j)) & 15) for j in range(8)]
    return [(e[i], e[i + 4]) for i in range(4)]


out = np.zeros((ROWS, TOKENS))
for row0 in range(0, ROWS, 16):
    acc = np.zeros((32, 2, 4))  # lane, fragment, c0..c3
    for block in range(K // 32):
        d = np.zeros((32, 2, 4))
        for f in range(2):
            for step in range(2):
                A, B = np.zeros((16, 16)), np.zeros((16, 8))
                for lane in range(32):
                    g, q = lane >> 2, lane & 3
                    lo, hi = word_pairs(row0 + g, block, q), word_pairs(row0 + g + 8, block, q)
                    A[g, 2 * q:2 * q + 2], A[g + 8, 2 * q:2 * q + 2] = lo[2 * step], hi[2 * step]
                    A[g, 2 * q + 8:2 * q + 10], A[g + 8, 2 * q + 8:2 * q + 10] = lo[2 * step + 1], hi[2 * step + 1]
                    xs = x16[f * 8 + g, block * 32 + 8 * q: block * 32 + 8 * q + 8]  # the lane's uint4
                    B[2 * q:2 * q + 2, g] = xs[4 * step: 4 * step + 2]
                    B[2 * q + 8:2 * q + 10, g] = xs[4 * step + 2: 4 * step + 4]
                D = A @ B
                for lane in range(32):
                    g, q = lane >> 2, lane & 3
                    d[lane, f] += [D[g, 2 * q], D[g, 2 * q + 1], D[g + 8, 2 * q], D[g + 8, 2 * q + 1]]
        for lane in range(32):
            g = lane >> 2
            s_lo, s_hi = 2.0 ** (scales[row0 + g, block] - 127), 2.0 ** (scales[row0 + g + 8, block] - 127)
            acc[lane] += d[lane] * np.array([s_lo, s_lo, s_hi, s_hi])
    for lane in range(32):
        g, q = lane >> 2, lane & 3
        for f in range(2):
            for h in range(2):
                out[row0 + g, f * 8 + 2 * q + h] = acc[lane, f, h]
                out[row0 + g + 8, f * 8 + 2 * q + h] = acc[lane, f, 2 + h]
diff = np.abs(out - W @ X.T).max()
print(f"largest difference {diff:.3g} (outputs up to {np.abs(W @ X.T).max():.3g})")
raise SystemExit(0 if diff < 1e-9 else 1)
