#!/usr/bin/env python3
"""bench/bench_generate.cpp's measurement, through PyTorch + transformers' generate.

    python3 bench/generate_torch.py bench/models/qwen3-0.6b --prompt 128 --tokens 32 \\
        --precision fp32 --threads 2
    python3 bench/generate_torch.py default --shapes 4,128,4,256,65 ...

Needs PyPI's torch and transformers (`pip install torch transformers`); never run by the tests.
A directory is built from its config.json alone (AutoModelForCausalLM.from_config, random
weights); `default` is qknorm's default model's shapes (layers, width, heads, context,
vocabulary, from --shapes, which bench_generate prints) as a GPT2LMHeadModel: transformers has
no QK-norm GPT-2, and two LayerNorms of D per head are noise next to the GEMMs. fp32 builds the
model in float32, bf16 in bfloat16 (what transformers' users run). One greedy generate() with
its KV cache (DynamicCache), do_sample=False, exactly `tokens` new tokens; a streamer stamps
each token as generate hands it over, so prefill tokens/s is prompt / (time to the first token)
and decode tokens/s is (tokens - 1) / (time from the first token to the last), as in
bench_generate. Median of 3 after a warm-up. Prints one JSON object.
"""
import argparse
import json
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel
from transformers.generation.streamers import BaseStreamer


class Stamps(BaseStreamer):
    """generate() calls put() with the prompt first, then with each new token."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def build(model, shapes, dtype):
    if model != "default":
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model), dtype=dtype)
    n_layer, n_embd, n_head, block_size, vocab = (int(v) for v in shapes.split(","))
    config = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=block_size,
                        vocab_size=vocab)
    return GPT2LMHeadModel(config).to(dtype)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--shapes", default="4,128,4,256,65")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    dtype = torch.float32 if args.precision == "fp32" else torch.bfloat16
    model = build(args.model, args.shapes, dtype).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, args.prompt))
    mask = torch.ones_like(ids)

    def generate(tokens):
        stamps = Stamps()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens,
                                 min_new_tokens=tokens, do_sample=False, use_cache=True,
                                 streamer=stamps, pad_token_id=0)
        assert out.shape[1] == args.prompt + tokens
        new = stamps.times[1:]  # [0] is the prompt
        return new[0] - start, new[-1] - new[0]

    generate(4)  # warm-up
    rounds = sorted(generate(args.tokens) for _ in range(3))
    prefill_s = sorted(r[0] for r in rounds)[1]
    decode_s = sorted(r[1] for r in rounds)[1]
    print(json.dumps({"engine": "torch", "model": args.model, "precision": args.precision,
                      "threads": args.threads, "prompt": args.prompt, "tokens": args.tokens,
                      "prefill_tokens_per_s": round(args.prompt / prefill_s, 1),
                      "decode_tokens_per_s": round((args.tokens - 1) / decode_s, 2),
                      "torch": torch.__version__,
                      "attention": model.config._attn_implementation}), flush=True)


if __name__ == "__main__":
    main()
