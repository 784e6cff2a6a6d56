#!/usr/bin/env python3
"""Cut a text file into training windows for the character-level GPT:

    python3 examples/char_gpt/prepare.py TEXT OUTDIR

The ids are the text's distinct bytes in increasing order (0, 1, ...), the
rule `./train generate --vocab TEXT` uses to turn text into ids and back,
so TEXT itself is the vocabulary file. Writes OUTDIR/x.npy and OUTDIR/y.npy,
int32 [N, 64]: N windows of 64 characters, one after another, and each
window's next characters (the same window one character on). Standard
library only (no numpy)."""
import array
import struct
import sys

SEQ, VOCAB = 64, 128  # model.json's window and embedding size


def write_npy(path, rows, width):
    header = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d, %d), }" % (len(rows) // width, width)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(rows.tobytes())


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: prepare.py TEXT OUTDIR")
    text = open(sys.argv[1], "rb").read()
    vocab = sorted(set(text))
    if len(vocab) > VOCAB:
        sys.exit("prepare.py: %s has %d distinct bytes; the model takes %d"
                 % (sys.argv[1], len(vocab), VOCAB))
    ids = array.array("i")
    index = {b: i for i, b in enumerate(vocab)}
    ids.extend(index[b] for b in text)
    n = (len(ids) - 1) // SEQ
    if n < 2:
        sys.exit("prepare.py: %s is too short (%d bytes)" % (sys.argv[1], len(text)))
    x, y = array.array("i"), array.array("i")
    for w in range(n):
        x.extend(ids[w * SEQ:(w + 1) * SEQ])
        y.extend(ids[w * SEQ + 1:(w + 1) * SEQ + 1])
    write_npy(sys.argv[2] + "/x.npy", x, SEQ)
    write_npy(sys.argv[2] + "/y.npy", y, SEQ)
    print("prepare.py: %d windows of %d characters, %d distinct bytes" % (n, SEQ, len(vocab)))


main()
