#!/usr/bin/env python3
"""Generation tokens/s of qknorm against PyTorch + transformers' generate, same shapes, same run.

    python3 bench/generate_vs_torch.py [--models default,bench/models/qwen3-0.6b]
        [--prompt 128] [--tokens 32] [--threads 1,2] [--precisions fp32,bf16] [--rounds 2]

For each model, thread count and precision it runs build/bench/bench_generate and
bench/generate_torch.py one after the other, `rounds` times with the order flipped each round
(the best of each engine's rounds is kept: a neighbour on the shared cores only ever adds time),
and prints prefill and decode tokens/s, their ratios qknorm / torch, and qknorm's decode as a
fraction of the memory-bandwidth bound bench_generate measures in the same process (a
STREAM-style copy; `of read`: a plain read, the tighter bound on one core).
"""
import argparse
import json
import os
import sys

from prefill_vs_torch import run

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def shapes_of(line):
    return ",".join(str(line[k]) for k in ("n_layer", "n_embd", "n_head", "block_size",
                                             "vocab_size"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="default," + os.path.join(HERE, "models", "qwen3-0.6b"))
    parser.add_argument("--prompt", default="128")
    parser.add_argument("--tokens", default="32")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "bench_generate"))
    args = parser.parse_args()
    best = {}  # (engine, model, precision, threads) -> the line with the fastest decode
    for model in args.models.split(","):
        for threads in [int(t) for t in args.threads.split(",")]:
            for precision in args.precisions.split(","):
                ours = [args.bench, model, "--prompt", args.prompt, "--tokens", args.tokens,
                        "--precision", precision]
                shapes = None
                for round_ in range(args.rounds):
                    engines = ["qknorm", "torch"] if round_ % 2 == 0 else ["torch", "qknorm"]
                    for engine in engines:
                        if engine == "torch" and shapes is None:  # its shapes come from ours
                            line = run(ours, threads)[0]
                            shapes = shapes_of(line)
                            keep(best, line, model)
                        command = ours if engine == "qknorm" else [
                            sys.executable, os.path.join(HERE, "generate_torch.py"), model,
                            "--shapes", shapes, "--prompt", args.prompt, "--tokens",
                            args.tokens, "--precision", precision, "--threads", str(threads)]
                        for line in run(command, threads):
                            shapes = shapes or shapes_of(line)
                            keep(best, line, model)
    print(f"generation, prompt {args.prompt} tokens then {args.tokens} new, greedy; "
          "tokens/s, best of each engine's rounds")
    print(f"{'model':>12} {'precision':>9} {'threads':>7} {'prefill':>8} {'torch':>8} "
          f"{'ratio':>6} {'decode':>7} {'torch':>7} {'ratio':>6} {'bound':>7} {'of bound':>8} "
          f"{'of read':>7}")
    for (engine, model, precision, threads), ours in sorted(best.items()):
        if engine != "qknorm":
            continue
        theirs = best.get(("torch", model, precision, threads))
        name = os.path.basename(model.rstrip("/"))
        tp = theirs["prefill_tokens_per_s"] if theirs else float("nan")
        td = theirs["decode_tokens_per_s"] if theirs else float("nan")
        print(f"{name:>12} {precision:>9} {threads:>7} {ours['prefill_tokens_per_s']:>8.1f} "
              f"{tp:>8.1f} {ours['prefill_tokens_per_s'] / tp:>5.2f}x "
              f"{ours['decode_tokens_per_s']:>7.2f} {td:>7.2f} "
              f"{ours['decode_tokens_per_s'] / td:>5.2f}x {ours['bound_tokens_per_s']:>7.2f} "
              f"{ours['of_bound']:>8.2f} {ours['of_read_bound']:>7.2f}")


def keep(best, line, model):
    key = (line["engine"], model, line["precision"], line["threads"])
    if key not in best or line["decode_tokens_per_s"] > best[key]["decode_tokens_per_s"]:
        best[key] = line
    print(json.dumps(line), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
