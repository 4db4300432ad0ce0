#!/usr/bin/env python3
"""Writes tests/data/minifloat/*.json: what PyTorch and NumPy make of float16, FP8 E4M3 and E5M2.

tests/test_minifloat.cpp checks core/minifloat.h against these files. For each format:
  values  [code, value] as NumPy/PyTorch decode it (all 256 for FP8; for float16 a sample:
          subnormals, the smallest normals, [1, 2), the top and the specials), "nan"/"inf"
          spelled out;
  rounds  [float32 bits, code] pairs: each value, the midpoint of each neighbouring pair (a tie)
          and the floats just below and above it, with both signs, plus the overflow boundary,
          infinities, NaN and values far out of range, converted by PyTorch (FP8: torch's
          float8_e4m3fn saturates, float8_e5m2 overflows to Inf) or NumPy (float16).
Run from the repository root:  python3 tools/make_minifloat_fixtures.py
"""
import json
import math
import os

import numpy as np
import torch

OUT = os.path.join("tests", "data", "minifloat")


def f32_bits(x):
    return int(np.array([x], dtype=np.float32).view(np.uint32)[0])


def spell(v):
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def probes(finite_values):
    """Ties between neighbours and the floats just beside them, both signs."""
    pos = sorted(v for v in set(finite_values) if v >= 0)
    out = []
    for a, b in zip(pos, pos[1:]):
        mid = np.float32((a + b) / 2)  # exact: these formats' midpoints fit in a float32
        assert float(mid) == (a + b) / 2
        for x in (np.float32(a), mid, np.nextafter(mid, np.float32(-1)),
                  np.nextafter(mid, np.float32(np.inf))):
            out += [x, -x]
    top = pos[-1]
    gap = pos[-1] - pos[-2]
    for x in (top + gap / 2, top + gap / 2 * 0.999, top + gap / 2 * 1.001, top * 4, 1e30, 3e38):
        out += [np.float32(x), -np.float32(x)]
    out += [np.float32(np.inf), np.float32(-np.inf), np.float32(np.nan), np.float32(1e-30),
            np.float32(-1e-30), np.float32(0.0), np.float32(-0.0)]
    return out


def fp8(name, dtype):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)
    values = [float(v) for v in codes.to(torch.float32)]
    xs = probes([v for v in values if math.isfinite(v)])
    got = torch.tensor(np.array(xs, dtype=np.float32)).to(dtype).view(torch.uint8)
    rounds = [[f32_bits(x), int(c)] for x, c in zip(xs, got)]
    write(name, {"format": name, "source": f"torch {torch.__version__} {dtype}",
                 "values": [[c, spell(v)] for c, v in enumerate(values)], "rounds": rounds})


def float16():
    # A sample (the test also checks every code and every tie against its own brute-force
    # reference): subnormals, the smallest normals, [1, 2), the top of the range and Inf/NaN.
    mantissas = {0: range(0, 1024, 4), 1: range(0, 1024, 4), 15: range(0, 1024, 16),
                 30: range(960, 1024), 31: (0, 1, 512)}
    codes = [s << 15 | e << 10 | m for s in (0, 1) for e, ms in mantissas.items() for m in ms]
    values = np.array(codes, dtype=np.uint16).view(np.float16).astype(np.float64)
    sample = [float(v) for v in values if math.isfinite(v)]
    xs = probes(sample)
    with np.errstate(over="ignore"):  # the overflow to Inf is what is being recorded
        got = np.array(xs, dtype=np.float32).astype(np.float16).view(np.uint16)
    rounds = [[f32_bits(x), int(c)] for x, c in zip(xs, got)]
    write("float16", {"format": "float16", "source": f"numpy {np.__version__}",
                      "values": [[c, spell(float(v))] for c, v in zip(codes, values)],
                      "rounds": rounds})


def write(name, data):
    path = os.path.join(OUT, name + ".json")
    with open(path, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    print(f"{path}: {len(data['values'])} values, {len(data['rounds'])} roundings")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    fp8("e4m3", torch.float8_e4m3fn)
    fp8("e5m2", torch.float8_e5m2)
    float16()
