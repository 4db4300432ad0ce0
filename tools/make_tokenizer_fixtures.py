#!/usr/bin/env python3
"""Makes the tokenizer fixtures of tests/test_tokenizer.cpp, from Tiny Shakespeare alone (no
download):

  - three byte-level BPE tokenizer.json files trained by Hugging Face `tokenizers`, one per
    pre-tokenizer family: GPT-2's (ByteLevel with its regex), Qwen2/3's (NFC, then a Split on its
    regex, then ByteLevel without one) and cl100k's as OLMo 2 and Llama 3 use it (ignore_merges);
  - a SentencePiece BPE model set up as Gemma's is (byte fallback, digits split, no dummy
    prefix, identity normalisation), trained by the `sentencepiece` package;
  - cases.json: the ids each of them gives for strings chosen to break tokenizers (emoji, CJK,
    combining marks, runs of spaces and newlines, odd white space, special tokens) and for the
    first 40,000 bytes of Tiny Shakespeare;
  - reference_merges.json: the merges of tools/bpe_reference.py, a plain independent trainer,
    on the first 200,000 bytes, checked here to equal those of `tokenizers` on the same text.

    pip install tokenizers sentencepiece
    python3 tools/make_tokenizer_fixtures.py tests/data/tokenizers

The C++ suite reads the committed output and needs no Python.
"""
import json
import os
import sys
import tempfile

import sentencepiece as spm
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe_reference  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "data", "tinyshakespeare.txt")

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CL100K_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
                  r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CASES = [
    "",
    "Hello world",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n",
    "   leading spaces, trailing spaces   ",
    "tabs\tand\t\ttabs\n\n\n\nnewlines \n \n",
    "CRLF line\r\nnext\r\n\r\n",
    "don't WE'LL they're I'M you'VE she'd it's",
    "numbers 1234567 3.14159 2026-11-25 ٣٤٥",
    "émigré café naïve — “quotes” ‘single’ …",
    "combining: e\u0301 a\u0308 n\u0303 and precomposed: é ä ñ",
    "emoji 😀 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️",
    "CJK 你好世界 こんにちは 안녕하세요",
    "Arabic مرحبا Hebrew שלום Thai สวัสดี Devanagari नमस्ते",
    "odd spaces:\u00a0nbsp\u3000ideographic\u2003em\u0085nel\u2028ls",
    "<|endoftext|>special<|endoftext|> tokens <|endoftext|>",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "a" * 300 + " " + "ab" * 100,
    "!!!??? ... ---- **** ____ ((()))",
]


def train_bpe(pre_tokenizer, vocab_size, specials, normalizer=None):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([CORPUS], trainer)
    return tok


def with_ignore_merges(tok):
    config = json.loads(tok.to_str())
    config["model"]["ignore_merges"] = True
    return Tokenizer.from_str(json.dumps(config))


def bpe_tokenizers():
    gpt2 = train_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False), 1000, ["<|endoftext|>"])
    qwen_pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    qwen = train_bpe(qwen_pre, 800, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                     normalizers.NFC())
    cl100k_pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(CL100K_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    cl100k = with_ignore_merges(train_bpe(cl100k_pre, 900, ["<|endoftext|>"]))
    return {"gpt2_style": gpt2, "qwen_style": qwen, "cl100k_style": cl100k}


def sentencepiece_model(out_dir):
    prefix = os.path.join(out_dir, "sp_bpe")
    spm.SentencePieceTrainer.train(
        input=CORPUS, model_prefix=prefix, vocab_size=500, model_type="bpe", byte_fallback=True,
        split_digits=True, add_dummy_prefix=False, normalization_rule_name="identity",
        remove_extra_whitespaces=False, character_coverage=1.0, user_defined_symbols=["<mask>"],
        minloglevel=2)
    os.remove(prefix + ".vocab")
    return spm.SentencePieceProcessor(model_file=prefix + ".model")


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    with open(CORPUS, encoding="utf-8") as f:
        text = f.read()
    texts = CASES + [text[:40000]]
    cases = {"texts": texts, "ids": {}}
    for name, tok in bpe_tokenizers().items():
        tok.save(os.path.join(out_dir, name + ".json"))
        ids = [tok.encode(t, add_special_tokens=False).ids for t in texts]
        for t, i in zip(texts, ids):
            assert tok.decode(i, skip_special_tokens=False) == (
                t if name != "qwen_style" else __import__("unicodedata").normalize("NFC", t))
        cases["ids"][name] = ids
    sp = sentencepiece_model(out_dir)
    cases["ids"]["sp_bpe"] = [sp.encode(t) for t in texts]
    with open(os.path.join(out_dir, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=True)

    # The independent trainer against tokenizers' on the same 200 kB.
    head = text[:200000]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as f:
        f.write(head)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([f.name], trainer)
    os.remove(f.name)
    theirs = [" ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    ours = bpe_reference.train(head.encode("utf-8"), 600 - 257)
    assert ours == theirs, "bpe_reference.py and tokenizers disagree"
    with open(os.path.join(out_dir, "reference_merges.json"), "w", encoding="utf-8") as f:
        json.dump({"corpus_bytes": 200000, "vocab_size": 600, "special_tokens": ["<|endoftext|>"],
                   "merges": ours}, f, ensure_ascii=True, indent=0)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data", "tokenizers"))
