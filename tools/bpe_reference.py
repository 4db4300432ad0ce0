#!/usr/bin/env python3
"""A plain byte-level BPE trainer, written to be read and to check nn/text/bpe_train.cpp against: no
incremental bookkeeping, every pair recounted before every merge.

Words come from GPT-2's pre-tokenizer regex; each is a tuple of byte symbols. A merge joins the
most frequent adjacent pair (counted over the words, weighted by how often each word occurs);
among equally frequent pairs the one whose ids are smallest, (left, right) in order, wins, where
ids number the special tokens first, then the 256 byte symbols in the order of GPT-2's
printable characters, then each merge's new symbol in turn. A pair's occurrences in a word merge
left to right without overlapping ("aaa" -> "aa" "a").

    python3 tools/bpe_reference.py FILE MERGES   # prints the merges, one "left right" a line
"""
import collections
import sys

import regex

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bytes_to_unicode():
    """GPT-2's printable stand-in for each byte: itself when printable, else 256 + n."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
                 list(range(ord("®"), ord("ÿ") + 1)))
    stand_in, extra = {}, 0
    for b in range(256):
        if b in printable:
            stand_in[b] = chr(b)
        else:
            stand_in[b] = chr(256 + extra)
            extra += 1
    return stand_in


def train(corpus: bytes, merges: int, specials=1):
    stand_in = bytes_to_unicode()
    words = collections.Counter(
        tuple(stand_in[b] for b in piece.encode("utf-8"))
        for piece in regex.findall(GPT2_PATTERN, corpus.decode("utf-8")))
    ids = {s: specials + i for i, s in enumerate(sorted(stand_in.values()))}
    out = []
    for _ in range(merges):
        pairs = collections.Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], ids[p[0]], ids[p[1]]))
        joined = best[0] + best[1]
        ids[joined] = specials + len(ids)
        out.append(best[0] + " " + best[1])
        merged = collections.Counter()
        for word, n in words.items():
            symbols, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    symbols.append(joined)
                    i += 2
                else:
                    symbols.append(word[i])
                    i += 1
            merged[tuple(symbols)] += n
        words = merged
    return out


if __name__ == "__main__":
    with open(sys.argv[1], "rb") as f:
        print("\n".join(train(f.read(), int(sys.argv[2]))))
