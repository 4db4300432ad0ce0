#!/usr/bin/env python3
"""Export -> transformers' AutoTokenizer -> the same ids: a Qwen3-shaped model is trained for two
steps with each tokenizer qknorm can export (bytes, a BPE tokenizer.json, a SentencePiece model),
exported with `qknorm export --hf`, and the exported directory's tokenizer is loaded by
transformers; its ids for a set of texts must equal `qknorm tokenizer encode`'s with the
tokenizer the run trained with.

    pip install transformers tokenizers sentencepiece protobuf     (no torch needed)
    python3 tools/check_hf_tokenizer.py build/examples/qknorm tests/data/tokenizers

Known difference (docs/models.md): a SentencePiece model that collapses runs of spaces
(remove_extra_whitespaces) folds "a  b" into one space; transformers' converted tokenizer keeps
both. The texts below have single spaces, as that rule is not the exporter's to change.
"""
import os
import subprocess
import sys
import tempfile

from transformers import AutoTokenizer

TEXTS = ["ROMEO: hi, 1234", "To be, or not to be: that is the question.",
         "caf\u00e9 \U0001F600 <mask>", "\tindented\nnew line"]
SHAPE = ["--norm", "rmsnorm", "--qk-norm", "rmsnorm", "--pos-emb", "rope", "--mlp", "swiglu",
         "--bias", "false", "--n-kv-head", "1", "--n-layer", "1", "--n-head", "2", "--n-embd",
         "16", "--block-size", "16", "--steps", "2", "--batch-size", "2", "--sample-tokens", "0",
         "--quiet", "--precision", "fp32"]


def run(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def main(qknorm, fixtures):
    failures = 0
    with tempfile.TemporaryDirectory() as out:
        for name, tokenizer in [("bytes", "byte"), ("bpe", f"{fixtures}/gpt2_style.json"),
                                ("sentencepiece", f"{fixtures}/sp_bpe.model")]:
            run_dir, hf = f"{out}/{name}_run", f"{out}/{name}_hf"
            run(qknorm, "train", "--tokenizer", tokenizer, "--run-dir", run_dir, *SHAPE)
            run(qknorm, "export", "--run-dir", run_dir, "--hf", hf)
            theirs = AutoTokenizer.from_pretrained(hf)
            ckpt = sorted(f for f in os.listdir(run_dir) if f.endswith(".model.safetensors"))[-1]
            for text in TEXTS:
                ours = [int(i) for i in
                        run(qknorm, "tokenizer", "encode", "--ordinary", "--tokenizer",
                            f"{run_dir}/{ckpt}", "--text", text).split()]
                got = theirs(text, add_special_tokens=False)["input_ids"]
                ok = got == ours
                failures += not ok
                print(f"{'same' if ok else 'DIFF'}  {name:13s} {type(theirs).__name__:24s} {text!r}"
                      + ("" if ok else f"\n      qknorm {ours}\n      theirs {got}"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
