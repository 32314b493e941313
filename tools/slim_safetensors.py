#!/usr/bin/env python3
"""Copies a .safetensors file without the tensors whose names start with any
of the given prefixes (e.g. a VAE's encoder., which decode() never reads),
so the GPU bundle carries only what the decoders load. Standard library
only: the format is a u64 little-endian header length, a JSON header of
{name: {dtype, shape, data_offsets}}, then the raw data.

    slim_safetensors.py IN OUT encoder. quant_conv.
"""
import json
import struct
import sys


def main():
    src, dst, prefixes = sys.argv[1], sys.argv[2], tuple(sys.argv[3:])
    with open(src, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        data = f.read()
    out_header, chunks, offset = {}, [], 0
    for name, entry in header.items():
        if name == "__metadata__":
            out_header[name] = entry
            continue
        if name.startswith(prefixes):
            continue
        begin, end = entry["data_offsets"]
        chunks.append(data[begin:end])
        out_header[name] = dict(entry, data_offsets=[offset, offset + end - begin])
        offset += end - begin
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # keep the data 8-byte aligned, as writers do
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for chunk in chunks:
            f.write(chunk)


if __name__ == "__main__":
    main()
