#!/usr/bin/env python3
"""Encoding MB/s on one thread: qknorm's tokenizers against Hugging Face `tokenizers`, on the same
tokenizer files and the same text, in the same run.

    python3 bench/tokenizer_vs_hf.py [--text data/tinyshakespeare.txt] [--rounds 5]
        [--tokenizers tests/data/tokenizers/gpt2_style.json,...]

By default it trains a GPT-2-style tokenizer of 8,192 ids on the text with `qknorm tokenizer
train` (Hugging Face's trainer gives the same file), and adds the committed Qwen- and
cl100k-style fixtures. Each round of each engine loads the tokenizer afresh and encodes the whole
text in one call (Hugging Face: `Tokenizer.encode(text, add_special_tokens=False)`), then each
line on its own (Hugging Face: one `encode_batch` of the lines); RAYON_NUM_THREADS=1. The best
round is kept. The ids must agree (count and checksum).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def hf_round(path, text, rounds, lines):
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer
    best, ids = 1e30, []
    for _ in range(rounds):
        tok = Tokenizer.from_file(path)
        t0 = time.perf_counter()
        if lines:
            parts = text.splitlines(keepends=True)
            t0 = time.perf_counter()
            ids = [i for e in tok.encode_batch(parts, add_special_tokens=False) for i in e.ids]
        else:
            ids = tok.encode(text, add_special_tokens=False).ids
        best = min(best, time.perf_counter() - t0)
    checksum = 0
    for i in ids:
        checksum = (checksum * 1000003 + i) % (1 << 64)
    return {"tokens": len(ids), "checksum": checksum, "seconds": best,
            "mb_per_s": len(text.encode("utf-8")) / 1e6 / best}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--text", default=os.path.join(ROOT, "data", "tinyshakespeare.txt"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokenizers", default="")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = parser.parse_args()
    paths = [p for p in args.tokenizers.split(",") if p]
    if not paths:
        trained = os.path.join(tempfile.mkdtemp(), "gpt2_8192.json")
        subprocess.run([os.path.join(args.build, "examples", "qknorm"), "tokenizer", "train",
                        "--vocab-size", "8192", "--out", trained, "--quiet", args.text], check=True,
                       stdout=subprocess.DEVNULL)
        fixtures = os.path.join(ROOT, "tests", "data", "tokenizers")
        paths = [trained, os.path.join(fixtures, "qwen_style.json"),
                 os.path.join(fixtures, "cl100k_style.json")]
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    print(f"{'tokenizer':<22} {'input':<6} {'tokens':>8} {'qknorm MB/s':>12} {'HF MB/s':>9} "
          f"{'ratio':>6}")
    for path, lines in [(p, m) for p in paths for m in (False, True)]:
        out = subprocess.run([os.path.join(args.build, "bench", "bench_tokenizer"), path,
                              args.text, "--rounds", str(args.rounds)] + (["--lines"] if lines else []),
                             check=True, capture_output=True, text=True,
                             env=dict(os.environ, QK_NUM_THREADS="1")).stdout
        ours = json.loads(out)
        theirs = hf_round(path, text, args.rounds, lines)
        same = ours["tokens"] == theirs["tokens"] and ours["checksum"] == theirs["checksum"]
        name = os.path.basename(path)
        print(f"{name:<22} {'lines' if lines else 'whole':<6} {ours['tokens']:>8} {ours['mb_per_s']:>12.2f} {theirs['mb_per_s']:>9.2f} "
              f"{ours['mb_per_s'] / theirs['mb_per_s']:>5.2f}x{'' if same else '  IDS DIFFER'}")
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
