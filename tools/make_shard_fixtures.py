#!/usr/bin/env python3
"""Writes the token-file fixtures of tests/test_shards.cpp the way llm.c's and nanoGPT's data
scripts write theirs (llm.c dev/data/data_common.py write_datafile; nanoGPT data/*/prepare.py):

  llmc_u16_val.bin, llmc_u16_train.bin   magic 20240520, version 1, uint16 tokens
  llmc_u32_train.bin                     magic 20240801, version 7, uint32 tokens
  nanogpt/train.bin, nanogpt/val.bin     raw uint16, no header

Token i of a file named F is (i * 7919 + len(F)) % V, V = 65536 for uint16 and 200000 for uint32,
so the test recomputes every one.

    python3 tools/make_shard_fixtures.py tests/data/shards
"""
import os
import sys

import numpy as np


def tokens(name, n, vocab):
    return (np.arange(n, dtype=np.int64) * 7919 + len(name)) % vocab


def write_datafile(path, toks, uint32):
    header = np.zeros(256, dtype=np.int32)
    header[0] = 20240801 if uint32 else 20240520
    header[1] = 7 if uint32 else 1
    header[2] = len(toks)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(toks.astype(np.uint32 if uint32 else np.uint16).tobytes())


def main(out):
    os.makedirs(os.path.join(out, "nanogpt"), exist_ok=True)
    for name, n, uint32 in [("llmc_u16_val.bin", 300, False), ("llmc_u16_train.bin", 1000, False),
                            ("llmc_u32_train.bin", 700, True)]:
        write_datafile(os.path.join(out, name), tokens(name, n, 200000 if uint32 else 65536), uint32)
    for name, n in [("train.bin", 900), ("val.bin", 200)]:
        tokens(name, n, 65536).astype(np.uint16).tofile(os.path.join(out, "nanogpt", name))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/shards")
