#!/usr/bin/env python3
"""Dense vs exact encode, side by side, through `vaedecode encode`.

By default the FLUX.1/SD3-sized AutoencoderKL encoder of bench/models/flux1
(widths 128/256/512/512, 2 layers per block, 32 groups; the SD 1.x/SDXL
encoder has the same blocks with 4 latent channels) with seeded weights, on
seeded 1x3xNxN images in [-1, 1]. Configurations run interleaved round by
round so machine noise hits all of them alike. Prints a Markdown table:
median encode time, ratio to dense 1 thread, allocator peak MiB per rank,
max RSS of the leader, collectives per encode.

    bazel build //:vaedecode && python3 bench/encode_bench.py [--sizes 256,512] [--rounds 2]

A video encoder takes clips: --model bench/models/wan21 --frames 5 encodes
seeded 1x3x5xNxN clips (Wan 2.1's encoder, base_dim 96, at real widths).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

import numpy as np

CONFIGS = [
    ("dense, 1 process, 1 thread", ["--threads", "1"]),
    ("dense, 1 process, 2 threads", ["--threads", "2"]),
    ("exact, 2 ranks x 1 thread", ["--threads", "1", "--mode", "exact", "--ranks", "2"]),
]


def run(binary, model, image, flags, out_dir):
    cmd = [binary, "encode", "--model", model, "--seeded-weights", "1", "--image", image,
           "--out", os.path.join(out_dir, "latent.npy")] + flags
    line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return dict(re.findall(r"(\w+)=(\[[^\]]*\]|\S+)", line))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="bazel-bin/cli/vaedecode")
    ap.add_argument("--model", default="bench/models/flux1")
    ap.add_argument("--sizes", default="256,512", help="square images 1x3xNxN")
    ap.add_argument("--frames", type=int, default=0, help="video encoders: clips of this many frames")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="/tmp/vaedecode-encode-bench")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(f"binary: {args.binary}; model: {args.model} (seeded weights); cpus: {os.cpu_count()}\n")
    for n in (int(s) for s in args.sizes.split(",")):
        image = os.path.join(args.out, f"image{n}.npy")
        rng = np.random.default_rng(n)
        shape = (1, 3, args.frames, n, n) if args.frames else (1, 3, n, n)
        np.save(image, (rng.random(shape, dtype=np.float32) * 2 - 1).astype(np.float32))
        times = {name: [] for name, _ in CONFIGS}
        last = {}
        for _ in range(args.rounds):
            for name, flags in CONFIGS:
                fields = run(args.binary, args.model, image, flags, args.out)
                times[name].append(float(fields["encode_ms"]))
                last[name] = fields
        base = statistics.median(times[CONFIGS[0][0]])
        latent = last[CONFIGS[0][0]].get("latent_shape", "?")
        print(f"### {args.model}: image [{','.join(map(str, shape))}] -> latent {latent}, float32, "
              f"{args.rounds} rounds\n")
        print("| configuration | encode ms (median) | speed-up vs dense 1 thread | peak MiB per rank | "
              "max RSS MiB (leader) | collectives |")
        print("|---|---|---|---|---|---|")
        for name, _ in CONFIGS:
            f, med = last[name], statistics.median(times[name])
            print(f"| {name} | {med:.0f} | {base / med:.2f}x | {f.get('peak_mib', '')} | {f.get('max_rss_mib', '')} | "
                  f"{f.get('collectives', 0)} |")
        print()


if __name__ == "__main__":
    sys.exit(main())
