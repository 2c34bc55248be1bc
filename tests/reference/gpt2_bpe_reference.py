#!/usr/bin/env python3
"""GPT-2 byte-level BPE, written apart from worker/data/gpt2_tokenizer.cc as
the reference for tests/unit/data/gpt2_tokenizer_test.cc. Standard library
only (no regex, tiktoken or transformers).

  gpt2_bpe_reference.py ENCODER_JSON VOCAB_BPE OUTPUT INPUT...

Each INPUT is a file of raw bytes. OUTPUT gets one line per input: its token
ids, space-separated (an empty line for an empty input).

Pre-tokenization runs GPT-2's pattern with Python's `re`, a backtracking
engine like the `regex` module GPT-2 used. `re` has no \\p{L} or \\p{N}, so
those are spelled out as code point ranges from unicodedata.category, and
\\s as the Unicode White_Space property (the `regex` module's \\s; `re`'s
own \\s would also match U+001C..U+001F). Input bytes are decoded as UTF-8
with surrogateescape: an invalid byte becomes a lone surrogate (category Cs:
no letter, number or space), and encoding a piece gives its bytes back.
"""

import json
import re
import sys
import unicodedata

# Unicode's White_Space property (PropList.txt), stable since Unicode 6.3.
WHITE_SPACE = ("\\t\\n\\x0b\\x0c\\r\\x20\\x85\\xa0\\u1680\\u2000-\\u200a"
               "\\u2028\\u2029\\u202f\\u205f\\u3000")


def category_ranges(major):
    """Code point ranges whose general category starts with `major`, as the
    inside of a `re` character class."""
    ranges = []
    start = None
    for cp in range(0x110001):
        inside = cp <= 0x10FFFF and unicodedata.category(chr(cp))[0] == major
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            ranges.append("\\U%08x-\\U%08x" % (start, cp - 1))
            start = None
    return "".join(ranges)


def gpt2_pattern():
    letters = category_ranges("L")
    numbers = category_ranges("N")
    space = "[" + WHITE_SPACE + "]"
    return re.compile(
        "'s|'t|'re|'ve|'m|'ll|'d"
        "| ?[" + letters + "]+"
        "| ?[" + numbers + "]+"
        "| ?[^" + WHITE_SPACE + letters + numbers + "]+"
        "|" + space + "+(?![^" + WHITE_SPACE + "])"
        "|" + space + "+")


def byte_alphabet():
    """byte -> its character in GPT-2's token strings: printable Latin-1
    bytes stand for themselves, the rest, in order, for U+0100 onwards."""
    printable = (list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) +
                 list(range(0xAE, 0x100)))
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


def read_merges(path):
    ranks = {}
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[0].startswith("#version"):
        lines = lines[1:]
    for line in lines:
        line = line.rstrip("\r")
        if not line:
            continue
        left, right = line.split(" ")
        ranks[(left, right)] = len(ranks)
    return ranks


def bpe(symbols, ranks):
    """Merges the lowest-ranked adjacent pair, all its occurrences left to
    right, until no adjacent pair has a rank."""
    while len(symbols) > 1:
        best = None
        for pair in zip(symbols, symbols[1:]):
            rank = ranks.get(pair)
            if rank is not None and (best is None or rank < best[0]):
                best = (rank, pair)
        if best is None:
            break
        left, right = best[1]
        merged = []
        i = 0
        while i < len(symbols):
            if i + 1 < len(symbols) and symbols[i] == left and symbols[i + 1] == right:
                merged.append(left + right)
                i += 2
            else:
                merged.append(symbols[i])
                i += 1
        symbols = merged
    return symbols


def main(argv):
    if len(argv) < 4:
        sys.stderr.write(__doc__)
        return 64
    encoder_path, merges_path, output_path = argv[1:4]
    with open(encoder_path, encoding="utf-8") as f:
        encoder = json.load(f)
    ranks = read_merges(merges_path)
    alphabet = byte_alphabet()
    pattern = gpt2_pattern()
    lines = []
    for path in argv[4:]:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "surrogateescape")
        ids = []
        for piece in pattern.findall(text):
            symbols = [alphabet[b] for b in piece.encode("utf-8", "surrogateescape")]
            ids.extend(encoder[s] for s in bpe(symbols, ranks))
        lines.append(" ".join(str(i) for i in ids))
    with open(output_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
