#!/usr/bin/env python3
"""Two builds of the `vaedecode` CLI side by side: same decodes, same machine.

Made to compare LibTorch versions (Debian's 1.13 against PyPI's 2.11), but it
takes any two or more CLI binaries. Runs, interleaved round by round so
machine noise hits every binary alike:
  * every diffusers fixture case, dense float32 on 1 thread: max abs error of
    the sample against diffusers' own decode (fixture README: 1e-4), and time;
  * the embedded SD-1.x-sized decoder (128/256/512/512) on a seeded
    1x4xNxN latent: dense float32 at 1 and 2 threads, dense bfloat16 at 2
    threads, exact float32 on 2 ranks: median decode ms, the decode's
    allocator peak (the CPU allocator's high-water mark, the loaded model
    included; rank 0's in exact mode) and the process's max RSS.
Prints Markdown tables.

    /usr/bin/python3 bench/libtorch_compare.py \\
        --binary 1.13=/tmp/v113/vaedecode --binary 2.11=bazel-bin/cli/vaedecode \\
        [--fixtures ../shared/fixtures] [--size 64] [--rounds 3]
"""
import argparse
import json
import os
import re
import statistics
import struct
import subprocess

import numpy as np

SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def read_safetensors(path, name):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        meta = header[name]
        f.seek(8 + n + meta["data_offsets"][0])
        count = meta["data_offsets"][1] - meta["data_offsets"][0]
        data = np.frombuffer(f.read(count), dtype=SAFETENSORS_DTYPES[meta["dtype"]])
    return data.reshape(meta["shape"]).astype(np.float32)


def decode(binary, flags, out):
    cmd = [binary, "decode", "--out", out] + flags
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0 and "is not supported" in run.stderr:
        return None  # a fixture family this build does not have
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{run.stderr}")
    line = run.stdout.strip().splitlines()[-1]
    return dict(re.findall(r"(\w+)=(\[[^\]]*\]|\{[^}]*\}|\S+)", line))


def first_mib(field):
    return field.strip("[]").split(",")[0] if field else ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", action="append", required=True, help="LABEL=PATH, two or more")
    ap.add_argument("--fixtures", default=os.path.join(os.path.dirname(__file__), "../../shared/fixtures"))
    ap.add_argument("--size", type=int, default=64, help="latent side of the SD decodes (64 -> 512x512)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="/tmp/vaedecode-libtorch-compare")
    args = ap.parse_args()
    binaries = [tuple(b.split("=", 1)) for b in args.binary]
    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, "sample.npy")

    index = json.load(open(os.path.join(args.fixtures, "index.json")))
    cases = [(fx, c) for fx in index["fixtures"] for c in fx["cases"]]
    errors = {(label, fx["folder"], c["case"]): 0.0 for label, _ in binaries for fx, c in cases}
    fixture_ms = {key: [] for key in errors}

    size = args.size
    shape = f"1,4,{size},{size}"
    configs = [
        ("dense float32, 1 thread", ["--threads", "1"]),
        ("dense float32, 2 threads", ["--threads", "2"]),
        ("dense bfloat16, 2 threads", ["--threads", "2", "--dtype", "bfloat16"]),
        ("exact float32, 2 ranks x 1 thread", ["--threads", "1", "--mode", "exact", "--ranks", "2"]),
    ]
    times = {(label, name): [] for label, _ in binaries for name, _ in configs}
    last = {}
    for _ in range(args.rounds):
        for label, binary in binaries:
            for fx, c in cases:
                flags = ["--threads", "1", "--model", os.path.join(args.fixtures, fx["folder"]),
                         "--latent", os.path.join(args.fixtures, c["latent_file"])]
                fields = decode(binary, flags, out)
                key = (label, fx["folder"], c["case"])
                if fields is None:
                    errors.pop(key, None)
                    continue
                expected = read_safetensors(os.path.join(args.fixtures, c["expected_file"]), "sample")
                got = np.load(out)
                errors[key] = float(np.abs(got - expected).max()) if got.shape == expected.shape else float("inf")
                fixture_ms[key].append(float(fields["decode_ms"]))
            for name, flags in configs:
                fields = decode(binary, flags + ["--latent-shape", shape], out)
                times[(label, name)].append(float(fields["decode_ms"]))
                last[(label, name)] = fields

    labels = [label for label, _ in binaries]
    base = labels[0]
    print(f"### Fixtures: dense float32, 1 thread, {args.rounds} rounds\n")
    print("| fixture/case | " + " | ".join(f"{l} max abs err" for l in labels) + " | "
          + " | ".join(f"{l} ms" for l in labels) + " |")
    print("|---|" + "---|" * (2 * len(labels)))
    for fx, c in cases:
        if any((l, fx["folder"], c["case"]) not in errors for l in labels):
            continue
        name = f"{fx['folder']}/{c['case']}"
        errs = " | ".join(f"{errors[(l, fx['folder'], c['case'])]:.2e}" for l in labels)
        ms = " | ".join(f"{statistics.median(fixture_ms[(l, fx['folder'], c['case'])]):.0f}" for l in labels)
        print(f"| {name} | {errs} | {ms} |")
    print()
    print(f"### Embedded SD-1.x decoder, latent [{shape}] -> {size * 8}x{size * 8}, medians of {args.rounds}\n")
    print("| configuration | " + " | ".join(f"{l} decode ms" for l in labels) + " | "
          + " | ".join(f"{l}/{base} time" for l in labels[1:]) + " | "
          + " | ".join(f"{l} allocator peak / max RSS, MiB" for l in labels) + " |")
    print("|---|" + "---|" * (2 * len(labels) + len(labels) - 1))
    for name, _ in configs:
        med = {l: statistics.median(times[(l, name)]) for l in labels}
        ratios = " | ".join(f"{med[l] / med[base]:.2f}" for l in labels[1:])
        mem = " | ".join(f"{first_mib(last[(l, name)].get('peak_mib'))}"
                         f" / {last[(l, name)].get('max_rss_mib', '')}" for l in labels)
        print(f"| {name} | " + " | ".join(f"{med[l]:.0f}" for l in labels) + f" | {ratios} | {mem} |")


if __name__ == "__main__":
    main()
