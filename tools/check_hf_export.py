#!/usr/bin/env python3
"""Export -> transformers -> the same logits: each fixture of tests/data/hf is loaded by qknorm,
written back by its exporter (build/hf_reexport), loaded by transformers' from_pretrained,
and run on the fixture's ids; the logits must equal the ones transformers computed from the
original directory.

    pip install torch transformers safetensors
    python3 tools/check_hf_export.py build/hf_reexport tests/data/hf
"""
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

FAMILIES = ["gpt2", "qwen3", "olmo2", "gemma3"]


def main(reexport, fixtures):
    worst = 0.0
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([reexport, fixtures, out, *FAMILIES], check=True)
        for family in FAMILIES:
            model = AutoModelForCausalLM.from_pretrained(f"{out}/{family}", dtype=torch.float32)
            ref = load_file(f"{fixtures}/{family}/reference.safetensors")
            with torch.no_grad():
                logits = model.eval()(input_ids=ref["ids"].long()).logits
            want = ref["logits_f32"]
            error = float((logits - want).abs().max() / want.abs().max())
            print(f"{family:7s} {type(model).__name__:18s} relative error {error:.3g}")
            worst = max(worst, error)
    sys.exit(0 if worst <= 1e-5 else 1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
