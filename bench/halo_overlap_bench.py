#!/usr/bin/env python3
"""Exact decodes with and without the halo overlap, side by side (issue 17).

Runs the `vaedecode` CLI's exact mode on N local CPU ranks (Gloo on
loopback) with `--halo-overlap on` (convolutions compute the rows that need
no neighbour rows while the halo travels) and `off` (they wait for it
first), interleaved round by round. Prints a Markdown table: median decode
time, ratio, and the time the ranks spent blocked in communicator calls (all
kinds, and the leader's halo exchanges alone), and checks that both outputs
are equal to float32 rounding.

    bazel build //:vaedecode && python3 bench/halo_overlap_bench.py [--shape 1,4,64,64] [--ranks 2] [--rounds 3]
    python3 bench/halo_overlap_bench.py --model ../shared/fixtures/wan21 --shape 1,16,5,32,32
"""
import argparse
import os
import re
import statistics
import subprocess

import numpy as np


def run(args, overlap, out):
    cmd = [args.binary, "decode", "--mode", "exact", "--ranks", str(args.ranks), "--threads", "1",
           "--latent-shape", args.shape, "--halo-overlap", overlap, "--out", out]
    if args.model:
        cmd += ["--model", args.model]
    line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    fields = dict(re.findall(r"(\w+)=(\[[^\]]*\]|\{[^}]*\}|\S+)", line))
    nums = lambda text: [float(x) for x in text.strip("[]").split(",") if x]
    halo = re.search(r"blocked_ms:[^}]*?\bhalo=([\d.]+)", fields.get("comm", ""))
    return {
        "decode_ms": float(fields["decode_ms"]),
        "rank_decode_ms": nums(fields["rank_decode_ms"]),
        "rank_comm_ms": nums(fields["rank_comm_ms"]),
        "leader_halo_ms": float(halo.group(1)) if halo else 0.0,
        "collectives": int(fields["collectives"]),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="bazel-bin/cli/vaedecode")
    ap.add_argument("--model", default="", help="a diffusers VAE folder (default: the embedded SD-1.x decoder)")
    ap.add_argument("--shape", default="1,4,64,64")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="/tmp/vaedecode-halo-bench")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = {"on": [], "off": []}
    for _ in range(args.rounds):
        for overlap in ("off", "on"):
            results[overlap].append(run(args, overlap, os.path.join(args.out, f"{overlap}.npy")))
    on, off = np.load(os.path.join(args.out, "on.npy")), np.load(os.path.join(args.out, "off.npy"))
    diff = float(np.abs(on - off).max())
    print(f"### {args.model or 'embedded SD-1.x decoder'}: latent [{args.shape}], exact on {args.ranks} ranks "
          f"x 1 thread, {args.rounds} rounds, {os.cpu_count()} CPUs\n")
    print("| halo overlap | decode ms (median) | vs off | blocked in calls, ms per rank (median) | "
          "leader's halo waits, ms | collectives |")
    print("|---|---|---|---|---|---|")
    base = statistics.median(r["decode_ms"] for r in results["off"])
    for overlap in ("off", "on"):
        rs = results[overlap]
        med = statistics.median(r["decode_ms"] for r in rs)
        comm = [statistics.median(r["rank_comm_ms"][i] for r in rs) for i in range(args.ranks)]
        halo = statistics.median(r["leader_halo_ms"] for r in rs)
        print(f"| {overlap} | {med:.0f} | {base / med:.2f}x | {', '.join(f'{c:.0f}' for c in comm)} | {halo:.0f} | "
              f"{rs[-1]['collectives']} |")
    for overlap in ("off", "on"):
        print(f"\n{overlap}: decode ms per round " + ", ".join(f"{r['decode_ms']:.0f}" for r in results[overlap]), end="")
    print(f"\n\nmax |on - off| over the whole output: {diff:.2e}")


if __name__ == "__main__":
    main()
