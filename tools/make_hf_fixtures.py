#!/usr/bin/env python3
"""Makes the Hugging Face fixtures of tests/test_hf.cpp: tiny random models of GPT-2, Qwen3,
OLMo 2 and Gemma 3 (text), built by transformers from a config alone (no download), saved with
save_pretrained, and beside each one the logits and per-layer hidden states transformers computes
for fixed ids, in float32 and in float64.

    pip install torch transformers safetensors
    python3 tools/make_hf_fixtures.py tests/data/hf

The C++ suite reads the committed output and needs no Python. Every weight is random, norm gains
included (around 1, or around 0 for Gemma's (1 + w)), so a loader that skipped one would fail.
Some fixtures are stored in bfloat16 or float16 and sharded (model.safetensors.index.json), and
each model's config is also written in the older form transformers 4.x wrote
(config.v4.json: rope_theta, rope_local_base_freq, sliding_window_pattern), which the script
checks transformers reads as the same model.
"""
import copy
import json
import os
import sys

import torch
from safetensors.torch import save_file
import transformers
from transformers import (AutoConfig, Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config,
                          GPT2LMHeadModel, Olmo2Config, Olmo2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

VOCAB, T, B = 300, 13, 2


def families():
    """(name, model class, config, storage dtype, shard size, old-form config edits)."""
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                  num_attention_heads=4, max_position_embeddings=64, tie_word_embeddings=False)
    gpt2 = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=3, n_head=4,
                      bos_token_id=0, eos_token_id=0,
                      activation_function="gelu_new", layer_norm_epsilon=1e-5,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    qwen3 = Qwen3Config(**common, num_key_value_heads=2, head_dim=12, rms_norm_eps=1e-6,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    olmo2 = Olmo2Config(**common, num_key_value_heads=2, rms_norm_eps=1e-6, eos_token_id=0,
                        rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    gemma3_args = dict(common, tie_word_embeddings=True)
    gemma3 = Gemma3TextConfig(**gemma3_args, num_key_value_heads=1, head_dim=12,
                              rms_norm_eps=1e-6, query_pre_attn_scalar=10, sliding_window=5,
                              layer_types=["sliding_attention", "full_attention",
                                           "sliding_attention"],
                              rope_parameters={
                                  "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                  "sliding_attention": {"rope_type": "default",
                                                        "rope_theta": 1e4}})
    return [
        ("gpt2", GPT2LMHeadModel, gpt2, torch.float32, None, {}),
        ("qwen3", Qwen3ForCausalLM, qwen3, torch.bfloat16, "40KB",
         {"rope_theta": 1e6, "rope_scaling": None}),
        ("olmo2", Olmo2ForCausalLM, olmo2, torch.float32, None,
         {"rope_theta": 5e5, "rope_scaling": None}),
        ("gemma3", Gemma3ForCausalLM, gemma3, torch.float16, "60KB",
         {"rope_theta": 1e6, "rope_local_base_freq": 1e4, "sliding_window_pattern": 2,
          "rope_scaling": None}),
    ]


def randomise(model, unit_offset):
    """O(1)-ish random weights: every matrix, bias and gain, so that each one shows."""
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)
            if p.dim() == 1 and ("norm" in name or "ln_" in name) and name.endswith("weight"):
                p.copy_((0.0 if unit_offset else 1.0) + 0.3 * noise)
            else:
                p.copy_(0.15 * noise)


def old_form(config_path, edits):
    """The config as transformers 4.x wrote it: rope_theta (and rope_local_base_freq,
    sliding_window_pattern) in place of rope_parameters and layer_types."""
    with open(config_path) as f:
        cfg = json.load(f)
    if "sliding_window_pattern" in edits:
        cfg.pop("layer_types", None)
    cfg.pop("rope_parameters", None)
    cfg.pop("_sliding_window_pattern", None)
    cfg.update(edits)
    cfg["transformers_version"] = "4.51.3"
    return cfg


def round_weights(model, dtype):
    """The parameters rounded to the storage dtype, kept float32: the values the file holds.
    (model.to(dtype) would round the buffers too, RoPE's inv_freq and Gemma's embed_scale, which
    a model loaded from the file computes afresh.)"""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).to(p.dtype))


def float64_throughout(model):
    """transformers computes RoPE's angles and cos/sin, and RMSNorm, in float32 even in a float64
    model (they upcast half-precision inputs), and rounds Gemma's sqrt(C) to float32; the float64
    reference computes them in float64, with the same formulas, so that it is exact to float64's
    precision."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    for module in model.modules():
        if not type(module).__name__.endswith("RotaryEmbedding"):
            continue

        def forward(x, position_ids, layer_type=None):
            params = config.rope_parameters
            theta = (params[layer_type] if layer_type else params)["rope_theta"]
            steps = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
            inv_freq = 1.0 / (theta ** steps)
            freqs = position_ids[..., None].to(torch.float64) * inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

        module.forward = forward
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = rms_norm_float64(module)
        if hasattr(module, "embed_scale"):  # Gemma's sqrt(C), made as a float32 tensor
            with torch.no_grad():
                module.embed_scale.fill_(config.hidden_size ** 0.5)


def rms_norm_float64(module):
    eps = getattr(module, "variance_epsilon", None) or getattr(module, "eps")
    unit_offset = type(module).__name__.startswith("Gemma")  # Gemma's (1 + w)

    def forward(x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return y * ((1.0 + module.weight) if unit_offset else module.weight)

    return forward


def reference(model, ids):
    """Logits (B, T, V) and hidden states (L + 1, B, T, C) of a forward in the model's dtype."""
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    return out.logits, torch.stack(out.hidden_states)


def main(out_dir):
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(7))
    for name, cls, config, dtype, shard, edits in families():
        model = cls(config).eval()
        randomise(model, unit_offset=(name == "gemma3"))
        round_weights(model, dtype)  # the weights as stored, exactly
        directory = os.path.join(out_dir, name)
        kwargs = {"max_shard_size": shard} if shard else {}
        copy.deepcopy(model).to(dtype).save_pretrained(directory, **kwargs)
        if edits:
            v4 = old_form(os.path.join(directory, "config.json"), edits)
            with open(os.path.join(directory, "config.v4.json"), "w") as f:
                json.dump(v4, f, indent=2, sort_keys=True)
            check_same_config(directory, v4)
        logits32, hidden32 = reference(model, ids)
        model = model.to(torch.float64)
        float64_throughout(model)
        logits64, hidden64 = reference(model, ids)
        save_file({"ids": ids.to(torch.int32).contiguous(),
                   "logits_f32": logits32.contiguous(), "hidden_f32": hidden32.contiguous(),
                   "logits_f64": logits64.contiguous(), "hidden_f64": hidden64.contiguous()},
                  os.path.join(directory, "reference.safetensors"),
                  metadata={"transformers": transformers.__version__,
                            "torch": torch.__version__, "stored_dtype": str(dtype)})
        print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, "
              f"stored as {dtype}{', sharded' if shard else ''}")


def check_same_config(directory, v4):
    """transformers reads the old form as the same layer types and RoPE bases."""
    new = AutoConfig.from_pretrained(directory)
    tmp = os.path.join(directory, "_v4")
    os.makedirs(tmp, exist_ok=True)
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(v4, f)
    old = AutoConfig.from_pretrained(tmp)
    os.remove(os.path.join(tmp, "config.json"))
    os.rmdir(tmp)
    for key in ("layer_types", "rope_parameters"):
        assert getattr(old, key, None) == getattr(new, key, None), (key, old, new)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/hf")
