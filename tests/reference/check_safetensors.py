#!/usr/bin/env python3
"""Checks a safetensors file against raw float32 reference tensors.

Usage: check_safetensors.py FILE EXPECTED_DIR

The file is read with nothing but the format's definition: a little-endian
u64 header length, a JSON header mapping names to dtype, shape and
data_offsets (relative to the end of the header, contiguous, in order), then
the bytes (only the standard library: no numpy, no safetensors package).
EXPECTED_DIR/index.txt lists one tensor per line, "name dim0
dim1 ...", and EXPECTED_DIR/<name>.f32 holds its values. Every listed tensor
must be in the file with that shape, dtype F32 and bitwise the same values,
and the file must hold no other tensors. Prints one line and exits 0 when
all match, 1 otherwise.
"""
import json
import os
import struct
import sys


def main(path, expected_dir):
    with open(path, "rb") as f:
        blob = f.read()
    (header_len,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    data = blob[8 + header_len:]
    metadata = header.pop("__metadata__", {})
    problems = []
    # Offsets must tile the data section in order, without gaps.
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    end = 0
    for begin, stop, name in spans:
        if begin != end:
            problems.append(f"{name}: data starts at {begin}, expected {end}")
        end = stop
    if end != len(data):
        problems.append(f"tensors end at {end}, the data section has {len(data)} bytes")

    expected = {}
    with open(os.path.join(expected_dir, "index.txt")) as f:
        for line in f:
            words = line.split()
            if words:
                expected[words[0]] = [int(w) for w in words[1:]]
    if set(expected) != set(header):
        problems.append(f"tensors differ: file has {sorted(header)}, expected {sorted(expected)}")
    for name, shape in expected.items():
        entry = header.get(name)
        if entry is None:
            continue
        if entry["dtype"] != "F32" or entry["shape"] != shape:
            problems.append(f"{name}: {entry['dtype']} {entry['shape']}, expected F32 {shape}")
            continue
        begin, stop = entry["data_offsets"]
        got = data[begin:stop]
        with open(os.path.join(expected_dir, name + ".f32"), "rb") as f:
            want = f.read()
        if got != want:
            if len(got) != len(want):
                problems.append(f"{name}: {len(got)} bytes, expected {len(want)}")
            else:
                diff = sum(got[i:i + 4] != want[i:i + 4] for i in range(0, len(got), 4))
                problems.append(f"{name}: {diff} values differ")
    if problems:
        print("safetensors check failed: " + "; ".join(problems))
        return 1
    print(f"safetensors OK: {len(expected)} tensors, {len(data)} bytes, metadata {metadata}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
