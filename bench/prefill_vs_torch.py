#!/usr/bin/env python3
"""Prefill tokens/s of qknorm against PyTorch + transformers, same shapes, same run.

    python3 bench/prefill_vs_torch.py [--model bench/models/qwen3-0.6b] [--tokens 128,512]
                                      [--threads 1,2] [--precisions fp32,bf16] [--rounds 2]

For each thread count and precision it runs build/bench/bench_prefill and bench/prefill_torch.py
one after the other, `rounds` times with the order flipped each round (the cores are shared: a
neighbour only ever adds time, so the best of the rounds is kept for each engine), and prints
a table of tokens/s and their ratio, qknorm / torch, with raw cblas_sgemm's GFLOP/s measured by
bench_prefill in the same process as the reference of the machine's speed at that moment. Each
process builds its own model (about 2.4 GB in float32), so they never run at the same time.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(command, threads):
    env = dict(os.environ, QK_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{out.stdout}{out.stderr}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=os.path.join(HERE, "models", "qwen3-0.6b"))
    parser.add_argument("--tokens", default="128,512")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "bench_prefill"))
    args = parser.parse_args()
    best = {}  # (engine, precision, threads, tokens) -> the fastest line
    for threads in [int(t) for t in args.threads.split(",")]:
        for precision in args.precisions.split(","):
            ours = [args.bench, args.model, "--tokens", args.tokens, "--precision", precision]
            theirs = [sys.executable, os.path.join(HERE, "prefill_torch.py"), args.model,
                      "--tokens", args.tokens, "--precision", precision,
                      "--threads", str(threads)]
            for round_ in range(args.rounds):
                order = [ours, theirs] if round_ % 2 == 0 else [theirs, ours]
                for command in order:
                    for line in run(command, threads):
                        key = (line["engine"], precision, threads, line["tokens"])
                        if key not in best or line["seconds"] < best[key]["seconds"]:
                            best[key] = line
                        print(json.dumps(line), file=sys.stderr, flush=True)
    print(f"prefill of {os.path.basename(args.model.rstrip('/'))} (random weights), "
          "tokens/s, best of each engine's rounds")
    print(f"{'precision':>9} {'threads':>7} {'T':>5} {'qknorm':>9} {'torch':>9} {'ratio':>6} "
          f"{'qknorm GFLOP/s':>14} {'raw sgemm':>9}")
    for (engine, precision, threads, tokens), ours in sorted(best.items()):
        if engine != "qknorm":
            continue
        theirs = best.get(("torch", precision, threads, tokens))
        ratio = ours["tokens_per_s"] / theirs["tokens_per_s"] if theirs else float("nan")
        print(f"{precision:>9} {threads:>7} {tokens:>5} {ours['tokens_per_s']:>9.1f} "
              f"{theirs['tokens_per_s'] if theirs else float('nan'):>9.1f} {ratio:>5.2f}x "
              f"{ours['gflops']:>14.1f} {ours['raw_sgemm_gflops']:>9.1f}")


if __name__ == "__main__":
    main()
