#!/usr/bin/env python3
"""Two builds of the `vaedecode` CLI side by side, on the same models and latents: a change's
figures before and after, measured in one run.

Each case (a model, a latent shape, a mode) runs with both binaries once per round, rounds
interleaved, so machine noise hits both alike. Prints a Markdown table: median decode time of each,
after/before speed, the largest difference between their outputs, peak allocator MiB per rank and
collectives per decode (which must not change).

    git worktree add /tmp/before <commit> && (cd /tmp/before && tools/setup.sh && bazel build //:vaedecode)
    bazel build //:vaedecode
    python3 bench/before_after.py --before /tmp/before/bazel-bin/cli/vaedecode --after bazel-bin/cli/vaedecode

Cases are "label|model folder or -|latent shape|flags" (-: the embedded SD-sized default model);
--case repeats. Without --case: the default model at 512² and the LTX-2, HunyuanVideo 1.5 and Wan 2.1
fixtures, dense on 1 thread and exact on 2 ranks × 1 thread.
"""
import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys

import numpy as np

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "fixtures")
EXACT = "--threads 1 --mode exact --ranks 2"
DENSE = "--threads 1"


def default_cases():
    cases = []
    for label, model, shape in [
        ("SD-sized AutoencoderKL 512²", "-", "1,4,64,64"),
        ("LTX-2 (fixture widths) 17x256²", os.path.join(FIXTURES, "ltx2"), "1,128,3,8,8"),
        ("HunyuanVideo 1.5 (fixture widths) 9x256²", os.path.join(FIXTURES, "hunyuanvideo15"), "1,8,3,16,16"),
        ("Wan 2.1 (fixture widths) 9x256²", os.path.join(FIXTURES, "wan21"), "1,16,3,32,32"),
    ]:
        cases.append(f"{label}, dense 1 thread|{model}|{shape}|{DENSE}")
        cases.append(f"{label}, exact 2 ranks|{model}|{shape}|{EXACT}")
    return cases


def run(binary, model, shape, flags, out):
    cmd = [binary, "decode", "--latent-shape", shape, "--out", out] + shlex.split(flags)
    if model != "-":
        cmd += ["--model", model]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"failed: {shlex.join(cmd)}\n{done.stderr[-3000:]}")
    line = done.stdout.strip().splitlines()[-1]
    return dict(re.findall(r"(\w+)=(\[[^\]]*\]|\{[^}]*\}|\S+)", line))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default="bazel-bin/cli/vaedecode")
    ap.add_argument("--case", action="append", default=[], help="label|model|shape|flags")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", default="/tmp/vaedecode-before-after")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    cases = [c.split("|") for c in (args.case or default_cases())]
    print("command: " + shlex.join(sys.argv))
    figures = {}
    for r in range(args.rounds):
        for i, (label, model, shape, flags) in enumerate(cases):
            for side, binary in (("before", args.before), ("after", args.after)):
                out = os.path.join(args.workdir, f"{i}_{side}.npy")
                f = run(binary, model, shape, flags, out)
                entry = figures.setdefault((i, side), {"ms": [], "fields": f, "out": out})
                entry["ms"].append(float(f["decode_ms"]))
                entry["fields"] = f
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"\n{args.rounds} rounds, medians\n")
    print("| case | before ms | after ms | speed after/before | max abs difference | peak MiB per rank before → after "
          "| collectives before → after |")
    print("|---|---|---|---|---|---|---|")
    for i, (label, model, shape, flags) in enumerate(cases):
        b, a = figures[(i, "before")], figures[(i, "after")]
        diff = float(np.max(np.abs(np.load(b["out"]).astype(np.float64) - np.load(a["out"]).astype(np.float64))))
        mb, ma = statistics.median(b["ms"]), statistics.median(a["ms"])
        peak = lambda f: f["fields"].get("peak_mib", "?")
        coll = lambda f: f["fields"].get("collectives", "0")
        print(f"| {label} | {mb:.0f} | {ma:.0f} | {mb / ma:.2f}x | {diff:.1e} | {peak(b)} → {peak(a)} | "
              f"{coll(b)} → {coll(a)} |")


if __name__ == "__main__":
    main()
