#!/usr/bin/env python3
"""bench/bench_prefill.cpp's measurement, through PyTorch + transformers.

    python3 bench/prefill_torch.py bench/models/qwen3-0.6b --tokens 128,512 --precision fp32 --threads 2

Needs PyPI's torch and transformers (`pip install torch transformers`); never run by the tests.
The model is built from the directory's config.json alone (AutoModelForCausalLM.from_config,
transformers' own random initialisation) with its default attention (SDPA), in eval mode under
torch.inference_mode: the fastest way transformers runs a forward pass on the cpu. fp32 builds it
in float32; bf16 builds it in bfloat16 (transformers has no bf16-GEMMs-with-float32-weights mode
on the cpu outside autocast, and a bf16 model is what its users run). One sequence of T random
ids; the logits of every position, as qknorm computes them. Prints one JSON object per T, the
fields bench_prefill prints.
"""
import argparse
import json
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def median_seconds(fn, rounds):
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return samples[len(samples) // 2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("--tokens", default="128,512")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    dtype = torch.float32 if args.precision == "fp32" else torch.bfloat16
    start = time.perf_counter()
    config = AutoConfig.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    build_s = time.perf_counter() - start
    for tokens in [int(t) for t in args.tokens.split(",")]:
        ids = torch.randint(0, config.vocab_size, (1, tokens))
        with torch.inference_mode():
            def prefill():
                model(input_ids=ids, use_cache=False).logits
            prefill()  # warm-up
            seconds = median_seconds(prefill, args.rounds)
        print(json.dumps({"engine": "torch", "model": args.model_dir, "tokens": tokens,
                          "precision": args.precision, "threads": args.threads,
                          "seconds": round(seconds, 6), "tokens_per_s": round(tokens / seconds, 1),
                          "build_s": round(build_s, 1), "torch": torch.__version__,
                          "attention": model.config._attn_implementation}), flush=True)


if __name__ == "__main__":
    main()
