#!/usr/bin/env python3
"""Dense vs exact decode, side by side, through the `vaedecode` CLI.

By default the SD-1.x-sized embedded decoder (no --model: widths
128/256/512/512, 2 layers per block, seeded weights) on seeded 1x4xNxN
latents; --model and --shapes select another model (e.g. a Wan fixture with
1,16,5,32,32). Configurations run interleaved round by round so machine
noise hits all of them alike. Prints a Markdown table: median decode time,
ratio to dense 1 thread, peak allocator MiB per rank, max RSS, collectives
and bytes per decode.

    bazel build //:vaedecode && python3 bench/decode_bench.py [--sizes 32,64] [--rounds 2]
    python3 bench/decode_bench.py --model ../shared/fixtures/wan21 --shapes 1,16,5,32,32
    python3 bench/decode_bench.py --model bench/models/qwenimage21 --seeded-weights 1 --shapes 1,64,1,16,16
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

CONFIGS = [
    # name, extra flags, OMP threads
    ("dense, 1 process, 1 thread", ["--threads", "1"]),
    ("dense, 1 process, 2 threads", ["--threads", "2"]),
    ("exact, 2 ranks x 1 thread", ["--threads", "1", "--mode", "exact", "--ranks", "2"]),
]
COUNT_ONLY = [("exact, 4 ranks x 1 thread (counts)", ["--threads", "1", "--mode", "exact", "--ranks", "4"])]


def run(binary, shape, flags, out_dir, model, seeded_weights=None):
    cmd = [binary, "decode", "--latent-shape", shape, "--out", os.path.join(out_dir, "bench.npy")] + flags
    if model:
        cmd += ["--model", model]
    if seeded_weights is not None:
        cmd += ["--seeded-weights", str(seeded_weights)]
    line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    fields = dict(re.findall(r"(\w+)=(\[[^\]]*\]|\{[^}]*\}|\S+)", line))
    return fields, line


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="bazel-bin/cli/vaedecode")
    ap.add_argument("--sizes", default="32,64", help="square SD latents 1x4xNxN")
    ap.add_argument("--shapes", default="", help="explicit latent shapes, ';'-separated (overrides --sizes)")
    ap.add_argument("--model", default="", help="a diffusers VAE folder (default: the embedded model)")
    ap.add_argument("--seeded-weights", type=int, default=None,
                    help="seed the model's weights (a bench/models folder has a config.json only)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="/tmp/vaedecode-bench")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    env_info = subprocess.run([args.binary, "info"], capture_output=True, text=True).stdout
    libtorch = re.search(r"libtorch: (.*)", env_info)
    print(f"binary: {args.binary}; {libtorch.group(1) if libtorch else 'LibTorch ?'}; cpus: {os.cpu_count()}\n")
    shapes = args.shapes.split(";") if args.shapes else [f"1,4,{n},{n}" for n in args.sizes.split(",")]
    for shape in shapes:
        times = {name: [] for name, _ in CONFIGS}
        last = {}
        for _ in range(args.rounds):
            for name, flags in CONFIGS:
                fields, line = run(args.binary, shape, flags, args.out, args.model, args.seeded_weights)
                times[name].append(float(fields["decode_ms"]))
                last[name] = fields
        for name, flags in COUNT_ONLY:
            fields, _ = run(args.binary, shape, flags, args.out, args.model, args.seeded_weights)
            last[name] = fields
        base = statistics.median(times[CONFIGS[0][0]])
        sample = last[CONFIGS[0][0]].get("sample_shape", "?")
        print(f"### {args.model or 'embedded SD-1.x decoder'}: latent [{shape}] -> {sample}, float32, {args.rounds} rounds\n")
        print("| configuration | decode ms (median) | speed-up vs dense 1 thread | peak MiB per rank | max RSS MiB (leader) | collectives | bytes |")
        print("|---|---|---|---|---|---|---|")
        for name, _ in CONFIGS + COUNT_ONLY:
            f = last[name]
            if name in times:
                med = statistics.median(times[name])
                t, ratio = f"{med:.0f}", f"{base / med:.2f}x"
            else:
                t, ratio = "(4 processes on 2 cores)", "-"
            comm = f.get("comm", "")
            total_bytes = re.search(r"bytes=(\S+)", comm)
            print(f"| {name} | {t} | {ratio} | {f.get('peak_mib', '')} | {f.get('max_rss_mib', '')} | "
                  f"{f.get('collectives', 0)} | {total_bytes.group(1) if total_bytes else 0} |")
        print()
        for name, _ in COUNT_ONLY + CONFIGS[2:]:
            if "comm" in last[name]:
                print(f"- {name}: {last[name]['comm']}")
        print()


if __name__ == "__main__":
    sys.exit(main())
