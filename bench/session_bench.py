#!/usr/bin/python3
"""A streaming session against decoding the whole clip at the end, through `vaedecode decode`.

A real-time video generator makes a clip one latent frame at a time. Decoding the whole clip once
the last latent exists shows the first frame only after every latent frame was generated and
the whole clip decoded; a session (`--stream-chunks 1,1,...`) decodes each latent frame as it
arrives, with the causal decoder's cache carried between chunks. This runs both, interleaved
round by round, with the Wan 2.1-sized decoder of bench/models/wan21 (base_dim 96, seeded
weights) on a seeded 1x16xTxNxN latent, dense (1 process) and exact (2 ranks), 1 thread each:

- whole clip at the end: the decode's time (a first frame exists only after it);
- session: time to first frame (the first chunk's decode), the steady per-chunk latency (the
  median of the later chunks) and their sum, and the state each rank holds between chunks.

Both decode the same frames: the session's output is compared with the whole decode (dense byte
for byte, exact within 3e-5 by the fixtures' compare.py).

    bazel build //:vaedecode && /usr/bin/python3 bench/session_bench.py [--latent 16] [--frames 5] [--rounds 2]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
FIELD = re.compile(r"(\w+)=(\[[^\]]*\]|\S+)")


def run(args, flags, out):
    cmd = [args.binary, "decode", "--model", args.model, "--seeded-weights", "1", "--threads", "1",
           "--latent-shape", f"1,16,{args.frames},{args.latent},{args.latent}", "--seed", "3",
           "--out", out] + flags
    lines = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()
    chunks = [dict(FIELD.findall(line)) for line in lines if line.startswith("chunk=")]
    return dict(FIELD.findall(lines[-1])), chunks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(REPO, "bazel-bin/cli/vaedecode"))
    ap.add_argument("--model", default=os.path.join(REPO, "bench/models/wan21"))
    ap.add_argument("--latent", type=int, default=16, help="latent side (pixels: 8x)")
    ap.add_argument("--frames", type=int, default=5, help="latent frames (video: 1 + 4(T-1) frames)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="/tmp/vaedecode-session-bench")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    fixtures = os.environ.get("VAEDECODE_FIXTURES", os.path.join(REPO, "..", "shared", "fixtures"))
    modes = [("dense, 1 process", []), ("exact, 2 ranks", ["--mode", "exact", "--ranks", "2"])]
    one_by_one = ",".join(["1"] * args.frames)
    whole_ms = {m: [] for m, _ in modes}
    first_ms = {m: [] for m, _ in modes}
    steady_ms = {m: [] for m, _ in modes}
    total_ms = {m: [] for m, _ in modes}
    state = {}
    for _ in range(args.rounds):
        for name, flags in modes:
            whole_out = os.path.join(args.out, "whole.safetensors")
            session_out = os.path.join(args.out, "session.safetensors")
            summary, _ = run(args, flags, whole_out)
            whole_ms[name].append(float(summary["decode_ms"]))
            summary, chunks = run(args, flags + ["--stream-chunks", one_by_one], session_out)
            first_ms[name].append(float(chunks[0]["decode_ms"]))
            steady_ms[name].append(statistics.median(float(c["decode_ms"]) for c in chunks[1:]))
            total_ms[name].append(sum(float(c["decode_ms"]) for c in chunks))
            state[name] = chunks[-1]["state_mib"]
            if flags:
                verdict = subprocess.run([sys.executable, os.path.join(fixtures, "compare.py"), whole_out,
                                          session_out, "--atol", "3e-5", "--rtol", "0"],
                                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
                same = verdict.endswith("OK")
            else:
                same = open(whole_out, "rb").read() == open(session_out, "rb").read()
            if not same:
                sys.exit(f"{name}: the session's frames differ from the whole clip's")
    px = args.latent * 8
    print(f"### bench/models/wan21 (seeded), latent [1,16,{args.frames},{args.latent},{args.latent}] -> "
          f"{1 + 4 * (args.frames - 1)} frames of {px}x{px}, float32, 1 thread per rank, {args.rounds} rounds\n")
    print("| configuration | whole clip at the end: first frame after (ms) | session: time to first frame (ms) | "
          "session: steady per chunk (ms) | session: all chunks (ms) | state per rank between chunks (MiB) |")
    print("|---|---|---|---|---|---|")
    for name, _ in modes:
        print(f"| {name} | {statistics.median(whole_ms[name]):.0f} | {statistics.median(first_ms[name]):.0f} | "
              f"{statistics.median(steady_ms[name]):.0f} | {statistics.median(total_ms[name]):.0f} | "
              f"{state[name]} |")
    print()


if __name__ == "__main__":
    sys.exit(main())
