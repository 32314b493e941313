#!/usr/bin/env python3
"""Regenerates the hand-made seeds in safetensors_corpus/ (valid_* and bad_*).

Files named crash-* / fuzz-* were found by the fuzzer and are kept as they
are; this script never touches them. Pure Python, no dependencies.
"""
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "safetensors_corpus")


def raw(header_text, data=b""):
    h = header_text.encode() if isinstance(header_text, str) else header_text
    return struct.pack("<Q", len(h)) + h + data


def build(tensors, metadata=None, pad=True):
    """tensors: list of (name, dtype, shape, bytes), laid out back to back."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    data = b""
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + len(payload)]}
        offset += len(payload)
        data += payload
    text = json.dumps(header, separators=(",", ":"))
    if pad:
        text += " " * (-len(text) % 8)
    return raw(text, data)


SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
         "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}

SEEDS = {
    "valid_small_f32": build(
        [("decoder.conv_in.weight", "F32", [2, 1, 1, 1], struct.pack("<2f", 0.5, -1.5)),
         ("decoder.conv_in.bias", "F32", [2], struct.pack("<2f", 1.0, 2.0))],
        {"format": "pt"}),
    "valid_0d_i64": build([("step", "I64", [], struct.pack("<q", -3))]),
    "valid_empty_header": raw("{}      "),
    "valid_metadata_only": build([], {"format": "pt", "note": "caf\u00e9"}),
    "valid_zero_size": build([("empty", "F16", [0, 3], b""), ("one", "U8", [1], b"\x07"),
                              ("also_empty", "F32", [4, 0], b"")]),
    "valid_all_dtypes": build([("t_" + d.lower(), d, [2], bytes(range(2 * s)))
                               for d, s in SIZES.items()]),
    "valid_unaligned": build([("x", "F32", [], struct.pack("<f", 2.5))], pad=False),
    "valid_gap": raw('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
                     '"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}}', bytes(8)),
    "bad_short": b"\x05\x00\x00",
    "bad_header_len_zero": struct.pack("<Q", 0) + b"{}",
    "bad_header_len_past_end": struct.pack("<Q", 64) + b"{}",
    "bad_header_len_huge": struct.pack("<Q", 1 << 40) + b"{}",
    "bad_not_json": raw('{"a": '),
    "bad_not_object": raw("[1, 2, 3]"),
    "bad_entry_not_object": raw('{"a": 5}'),
    "bad_missing_dtype": raw('{"a":{"shape":[1],"data_offsets":[0,1]}}', b"x"),
    "bad_unknown_dtype": raw('{"a":{"dtype":"F8_E5M2","shape":[1],"data_offsets":[0,1]}}', b"x"),
    "bad_negative_dim": raw('{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}'),
    "bad_float_dim": raw('{"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}', b"x"),
    "bad_shape_overflow": raw('{"a":{"dtype":"F32","shape":[4294967296,4294967296,0],'
                              '"data_offsets":[0,0]}}'),
    "bad_offsets_reversed": raw('{"a":{"dtype":"U8","shape":[0],"data_offsets":[3,1]}}', b"xxx"),
    "bad_offsets_past_end": raw('{"a":{"dtype":"U8","shape":[9],"data_offsets":[0,9]}}', b"xxx"),
    "bad_offsets_huge": raw('{"a":{"dtype":"U8","shape":[0],"data_offsets":'
                            '[18446744073709551615,18446744073709551615]}}'),
    "bad_length_mismatch": raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', b"xxxx"),
    "bad_overlap": raw('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
                       '"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}', bytes(6)),
    "bad_metadata_not_strings": raw('{"__metadata__":{"format":["pt"]}}'),
    "bad_duplicate_name": raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                              '"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"xy"),
    "bad_nested_duplicate": raw('{"a":{"dtype":"U8","dtype":"I8","shape":[1],'
                                '"data_offsets":[0,1]}}', b"x"),
    "bad_deep_nesting": raw("[" * 5000 + "]" * 5000),
    "bad_invalid_utf8": raw(b'{"\xff\xfe":{}}'),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(OUT, name + ".safetensors"), "wb") as f:
            f.write(data)
    print(f"wrote {len(SEEDS)} seeds to {OUT}")


if __name__ == "__main__":
    main()
