#!/usr/bin/python3
"""Tiled decode under shrinking memory budgets vs the untiled decode, through the `vaedecode` CLI.

The SD-1.x-sized embedded decoder (no --model: widths 128/256/512/512, 2
layers per block, seeded weights) on a seeded 1x4x64x64 latent (512² output),
float32, 1 thread. First the untiled reference (`decode`, dense), then
`--mode tiled --budget-mib B` for B = 100%, 50%, 25% and 10% of the untiled
decode_peak_mib (whole MiB, rounded up). Each round runs the untiled decode and
then every budget, so machine noise hits all of them alike (--rounds, default
2); decode times are medians over the rounds. A budget whose 32-latent floor
tile cannot fit exits 1 with "out of memory ... the 32-latent floor tile needs
about N MiB": that is reported as "does not fit (floor tile ~N MiB)", not as a
failure of this script. Quality: PSNR of each tiled output against the untiled
one (signal = peak-to-peak range of the untiled output, as
tests/cli/cli_test.sh computes it) and the max abs difference.

Calibration results are cached in ~/.cache/vaedecode/profiles; the first tiled
run of a model calibrates.

    bazel build //:vaedecode && /usr/bin/python3 bench/tiled_bench.py [--rounds 2] [--shape 1,4,64,64]
    /usr/bin/python3 bench/tiled_bench.py --shape 1,4,16,16 --rounds 1    # smoke test
"""
import argparse
import math
import os
import re
import shlex
import statistics
import subprocess
import sys

import numpy as np

BUDGET_PERCENTS = [100, 50, 25, 10]


def default_binary():
    try:
        bin_dir = subprocess.run(["bazel", "info", "bazel-bin"], check=True, capture_output=True,
                                 text=True).stdout.strip()
        return os.path.join(bin_dir, "cli", "vaedecode")
    except (OSError, subprocess.CalledProcessError):
        return "bazel-bin/cli/vaedecode"


def parse_summary(line):
    fields = dict(re.findall(r"(\w+)=(\[[^\]]*\]|\{[^}]*\}|\S+)", line))
    mode = re.search(r"mode=(\w+)(?: \(([^)]*)\))?", line)
    if mode:
        fields["mode"] = mode.group(1)
        fields["mode_reason"] = mode.group(2) or ""
    return fields


def run_decode(binary, shape, flags, out):
    cmd = [binary, "decode", "--latent-shape", shape, "--threads", "1", "--out", out] + flags
    proc = subprocess.run(cmd, capture_output=True, text=True)
    summary = [l for l in proc.stdout.splitlines() if l.startswith("decoded ")]
    fields = parse_summary(summary[-1]) if proc.returncode == 0 and summary else {}
    # spdlog warnings (e.g. OOM retries) go to stdout, the error line to stderr
    logs = [l for l in proc.stdout.splitlines() + proc.stderr.splitlines() if "[warning]" in l or "[error]" in l]
    return proc.returncode, fields, proc.stderr.strip(), logs, cmd


def quality(dense, tiled):
    mse = float(np.mean((dense.astype(np.float64) - tiled.astype(np.float64)) ** 2))
    span = float(dense.max() - dense.min())
    psnr = 10 * math.log10(span * span / mse) if mse > 0 else float("inf")
    return psnr, float(np.max(np.abs(dense - tiled)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default="", help="the vaedecode CLI (default: $(bazel info bazel-bin)/cli/vaedecode)")
    ap.add_argument("--shape", default="1,4,64,64", help="latent shape (embedded SD-1.x decoder)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="/tmp/vaedecode-tiled-bench")
    args = ap.parse_args()
    binary = args.binary or default_binary()
    os.makedirs(args.out, exist_ok=True)

    print("command: " + " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv))
    env_info = subprocess.run([binary, "info"], capture_output=True, text=True).stdout
    libtorch = re.search(r"libtorch: (.*)", env_info)
    print(f"binary: {binary}; {libtorch.group(1) if libtorch else 'LibTorch ?'}; cpus: {os.cpu_count()}\n")

    dense_out = os.path.join(args.out, "dense.npy")
    budgets = None
    dense_times, dense_last = [], {}
    times, last, failures, warnings = {}, {}, {}, {}
    for r in range(args.rounds):
        rc, fields, err, logs, cmd = run_decode(binary, args.shape, [], dense_out)
        if rc != 0:
            sys.exit(f"untiled decode failed (rc {rc}): {' '.join(cmd)}\n{err}")
        dense_times.append(float(fields["decode_ms"]))
        dense_last = fields
        if budgets is None:
            peak = float(fields["decode_peak_mib"])
            budgets = []
            for pct in BUDGET_PERCENTS:
                b = max(1, math.ceil(peak * pct / 100.0))
                if b not in [x for _, x in budgets]:
                    budgets.append((pct, b))
            times = {b: [] for _, b in budgets}
        for pct, b in budgets:
            out = os.path.join(args.out, f"tiled_{b}.npy")
            if os.path.exists(out):
                os.remove(out)
            rc, fields, err, logs, cmd = run_decode(binary, args.shape,
                                              ["--mode", "tiled", "--budget-mib", str(b)], out)
            if logs:
                warnings.setdefault(b, []).extend(f"round {r + 1}: {w}" for w in logs)
            if rc == 0:
                times[b].append(float(fields["decode_ms"]))
                last[b] = fields
            else:
                floor = re.search(r"floor tile needs about ([\d.]+) MiB", err)
                if rc != 1 or "out of memory" not in err:
                    print(f"WARNING: unexpected failure at {b} MiB (rc {rc}): {err}", file=sys.stderr)
                failures[b] = (rc, floor.group(1) if floor else None, err)

    dense = np.load(dense_out)
    base = statistics.median(dense_times)
    print(f"### embedded SD-1.x decoder: latent [{args.shape}] -> {dense_last.get('sample_shape', '?')}, "
          f"float32, 1 thread, {args.rounds} rounds\n")
    print("| budget (% / MiB) | plan | decoder calls | OOM retries | decoded latents (vs stock) | "
          "decode ms (median) | time vs untiled | predicted peak MiB (planned, x1.25 headroom) | "
          "measured decode peak MiB | PSNR dB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(f"| untiled (dense) | untiled | 1 | - | - | {base:.0f} | 1.00x | - | "
          f"{dense_last.get('decode_peak_mib', '')} | - |")
    notes = []
    for pct, b in budgets:
        label = f"{pct}% / {b}"
        if b in last and b not in failures:
            f = last[b]
            med = statistics.median(times[b])
            psnr, maxabs = quality(dense, np.load(os.path.join(args.out, f"tiled_{b}.npy")))
            psnr_s = "inf (identical)" if math.isinf(psnr) else f"{psnr:.1f}"
            dl, sl = int(f.get("decoded_latents", 0)), int(f.get("stock_decoded_latents", 0))
            ratio_dl = f" ({dl / sl:.2f}x)" if sl else ""
            print(f"| {label} | {f.get('plan', '?')} | {f.get('tile_calls', '?')} | {f.get('tile_retries', '?')} | "
                  f"{dl} vs {sl}{ratio_dl} | {med:.0f} | {med / base:.2f}x | {f.get('predicted_peak_mib', '')} "
                  f"({f.get('planned_peak_mib', '')}) | "
                  f"{f.get('decode_peak_mib', '')} | {psnr_s} |")
            notes.append(f"- {label} MiB: mode=tiled ({f.get('mode_reason', '')}); max abs diff {maxabs:.3g}; "
                         f"decode ms per round {times[b]}; peak_mib {f.get('peak_mib', '')}, "
                         f"max_rss_mib {f.get('max_rss_mib', '')}")
        else:
            rc, floor, err = failures[b]
            why = f"does not fit (floor tile ~{floor} MiB)" if floor else f"failed (rc {rc})"
            print(f"| {label} | {why} | - | - | - | - | - | {floor or '-'} | - | - |")
            if b in last:
                notes.append(f"- {label} MiB: succeeded in some rounds but failed in another")
            msg = [l for l in err.splitlines() if "error" in l]
            msg = msg[-1] if msg else (err.splitlines()[-1] if err else "")
            notes.append(f"- {label} MiB: exit {rc}: {msg}")
    print()
    notes.insert(0, f"- untiled: decode ms per round {dense_times}; peak_mib {dense_last.get('peak_mib', '')}, "
                    f"max_rss_mib {dense_last.get('max_rss_mib', '')}")
    print("\n".join(notes))
    for b, w in warnings.items():
        for line in w:
            print(f"- {b} MiB log: {line}")
    print()


if __name__ == "__main__":
    sys.exit(main())
