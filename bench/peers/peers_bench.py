"""vaedecode against its peers, side by side in one run, on the same weights and latent.

The peers: diffusers' own AutoencoderKL decode (dense at 1 and 2 threads, tiled at 4 and 9 tiles,
bfloat16 at 1 thread) and DistVAE's patch-parallel decode at 2 ranks (gloo); against them the
`vaedecode` CLI dense (1 and 2 threads, bfloat16), exact on 2 ranks and tiled under two budgets.
Every configuration runs once per round, rounds interleaved, so machine noise hits them alike.

The model is a half-width SD-1.x AutoencoderKL (widths 64/128/256/256, 2 layers per block, 32
groups; --widths to change) built by diffusers with seeded weights and written with
save_pretrained, so both sides load the same safetensors file; the latent is seeded
(1x4x64x64 -> 512² by default). Errors are against diffusers' own float32 dense output; PSNR
clamps both outputs to [-1, 1] with peak-to-peak 2 (as the peers' tiling benchmarks compute it).
Max RSS is the largest process of a configuration (every rank), from wait4.

Prints the command, the machine and one Markdown table; writes the figures as JSON (--json) for
bench/peers/chart.py. Run through bench/peers/run.sh, which builds what this needs.

    bench/peers/run.sh [--rounds 3] [--latent 64]
"""
import argparse
import json
import math
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "peer_decode.py")
TIME = "/usr/bin/time"  # GNU time (Debian's `time`), for each configuration's max RSS


def run_processes(commands, env_extra=None):
    """Starts every command at once (the ranks of one decode), waits for all; returns
    [(rc, stdout, stderr, max_rss_mib)]. The max RSS is GNU time's (its own wait4, which covers the
    command and every child it reaped): a child forked from this Python process would report this
    process's resident size too (Linux keeps the pre-exec high-water mark)."""
    started = []
    for i, cmd in enumerate(commands):
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        rss = tempfile.NamedTemporaryFile(delete=False)
        rss.close()
        env = dict(os.environ, **(env_extra[i] if env_extra else {}))
        proc = subprocess.Popen([TIME, "-f", "%M", "-o", rss.name] + cmd, stdout=out, stderr=err, env=env)
        started.append((proc, out, err, rss.name))
    results = []
    for proc, out, err, rss in started:
        proc.wait()
        out.seek(0)
        err.seek(0)
        with open(rss) as f:
            kib = [line for line in f.read().split() if line.isdigit()]
        os.unlink(rss)
        results.append((proc.returncode, out.read().decode(), err.read().decode(),
                        int(kib[-1]) / 1024.0 if kib else float("nan")))
    return results


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summary_fields(stdout):
    line = stdout.strip().splitlines()[-1]
    return dict(re.findall(r"(\w+)=(\[[^\]]*\]|\{[^}]*\}|\([^)]*\)|\S+)", line))


class Config:
    def __init__(self, name, kind, args, ranks=1):
        self.name, self.kind, self.args, self.ranks = name, kind, args, ranks
        self.times, self.rss, self.last, self.out = [], [], {}, None
        self.refused = ""  # a tiled budget the floor tile cannot fit: reported, not a failure


def build_configs(binary, python, workdir, model, latent, tiled_budgets):
    peer = [python, PEER]
    given = ["--model", model, "--latent", latent]
    configs = [
        Config("diffusers dense, 1 thread", "diffusers", peer + ["diffusers"] + given + ["--threads", "1"]),
        Config("diffusers dense, 2 threads", "diffusers", peer + ["diffusers"] + given + ["--threads", "2"]),
        Config("diffusers tiled (4 tiles), 1 thread", "diffusers",
               peer + ["diffusers"] + given + ["--threads", "1", "--tile-latent", "48"]),
        Config("diffusers tiled (9 tiles), 1 thread", "diffusers",
               peer + ["diffusers"] + given + ["--threads", "1", "--tile-latent", "32"]),
        Config("diffusers dense bfloat16, 1 thread", "diffusers",
               peer + ["diffusers"] + given + ["--threads", "1", "--dtype", "bfloat16"]),
        Config("DistVAE, 2 ranks x 1 thread", "distvae", peer + ["distvae"] + given + ["--threads", "1"], ranks=2),
    ]
    ours = [binary, "decode", "--model", model, "--latent", latent]
    configs += [
        Config("vaedecode dense, 1 thread", "vaedecode", ours + ["--threads", "1"]),
        Config("vaedecode dense, 2 threads", "vaedecode", ours + ["--threads", "2"]),
        Config("vaedecode exact, 2 ranks x 1 thread", "vaedecode",
               ours + ["--threads", "1", "--mode", "exact", "--ranks", "2"], ranks=2),
        Config("vaedecode dense bfloat16, 1 thread", "vaedecode", ours + ["--threads", "1", "--dtype", "bfloat16"]),
    ]
    for budget in tiled_budgets:
        configs.append(Config(f"vaedecode tiled ({budget} MiB budget), 1 thread", "vaedecode",
                              ours + ["--threads", "1", "--mode", "tiled", "--budget-mib", str(budget)]))
    for i, c in enumerate(configs):
        c.out = os.path.join(workdir, f"out_{i}.npy")
    return configs


def run_config(c):
    if c.kind == "distvae":
        port = str(free_port())
        envs = [{"RANK": str(r), "WORLD_SIZE": str(c.ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                 "LOCAL_RANK": str(r)} for r in range(c.ranks)]
        results = run_processes([c.args + ["--out", c.out]] * c.ranks, envs)
    else:
        results = run_processes([c.args + ["--out", c.out]])
    for rc, out, err, _ in results:
        if rc == 1 and "--budget-mib" in c.args and "out of memory" in err:
            c.refused = err.strip().splitlines()[-1]
            return
        if rc != 0:
            sys.exit(f"{c.name} failed (rc {rc}): {shlex.join(c.args)}\n{err[-4000:]}")
    rss = max(r[3] for r in results)
    if c.kind == "vaedecode":
        fields = summary_fields(results[0][1])
        decode_ms = float(fields["decode_ms"])
        c.last = {"collectives": int(fields.get("collectives", 0)), "plan": fields.get("plan", ""),
                  "decoded_latents": fields.get("decoded_latents", ""), "peak_mib": fields.get("peak_mib", ""),
                  "decode_peak_mib": fields.get("decode_peak_mib", "")}
    else:
        reports = [json.loads(r[1].strip().splitlines()[-1]) for r in results]
        decode_ms = max(r["decode_ms"] for r in reports)
        c.last = {"collectives": reports[0].get("collectives", 0), "tiles": reports[0].get("tiles"),
                  "collectives_by_kind": reports[0].get("collectives_by_kind")}
    c.times.append(decode_ms)
    c.rss.append(rss)


def psnr(reference, sample):
    a = np.clip(reference.astype(np.float64), -1, 1)
    b = np.clip(sample.astype(np.float64), -1, 1)
    mse = float(np.mean((a - b) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(4.0 / mse)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="bazel-bin/cli/vaedecode")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latent", type=int, default=64, help="square latent 1x4xNxN")
    ap.add_argument("--widths", default="64,128,256,256")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="/tmp/vaedecode-peers")
    ap.add_argument("--json", default="", help="write the figures here (bench/peers/chart.py reads them)")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)

    print("command: " + shlex.join(sys.argv))
    info = subprocess.run([args.binary, "info"], capture_output=True, text=True).stdout
    libtorch = re.search(r"libtorch: (.*)", info)
    model = os.path.join(args.workdir, "model")
    made = run_processes([[sys.executable, PEER, "write-model", "--model", model, "--widths", args.widths,
                           "--seed", str(args.seed)]])[0]
    if made[0] != 0:
        sys.exit(f"writing the model failed: {made[2][-4000:]}")
    print(f"machine: {os.cpu_count()} cpus; vaedecode: {libtorch.group(1) if libtorch else 'LibTorch ?'}; "
          f"peers: {made[1].strip()}\n")
    latent = os.path.join(args.workdir, "latent.npy")
    np.save(latent, np.random.default_rng(args.seed).standard_normal((1, 4, args.latent, args.latent),
                                                                     dtype=np.float32))

    # Tiled budgets from vaedecode's own estimate of a 32-latent floor tile (a budget of 1 MiB is
    # refused before decoding, naming it): just above it plans 3x3 floor tiles (diffusers' 9-tile
    # count); 1.6x it (a 40x40 tile's area) plans 2x2 (diffusers' 4-tile count).
    probe = run_processes([[args.binary, "decode", "--model", model, "--latent", latent, "--threads", "1",
                            "--mode", "tiled", "--budget-mib", "1", "--out", os.path.join(args.workdir, "probe.npy")]])[0]
    floor = re.search(r"floor tile needs about ([\d.]+) MiB", probe[2])
    if probe[0] != 1 or not floor:
        sys.exit(f"vaedecode did not refuse a 1 MiB tiled budget naming the floor tile: {probe[2][-4000:]}")
    floor_mib = float(floor.group(1))
    # +8 MiB: the leader also holds the float32 output (3 MiB at 512²), taken off the budget.
    budgets = [math.ceil(floor_mib * 1.6), math.ceil(floor_mib) + 8]

    configs = build_configs(args.binary, sys.executable, args.workdir, model, latent, budgets)
    for r in range(args.rounds):
        for c in configs:
            run_config(c)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    reference = np.load(configs[0].out)
    base = statistics.median(configs[0].times)
    rows = []
    for c in configs:
        if c.refused:
            print(f"{c.name}: does not fit: {c.refused}", file=sys.stderr)
            continue
        sample = np.load(c.out)
        med = statistics.median(c.times)
        tiles = c.last.get("tiles") or c.last.get("plan") or ""
        rows.append({
            "name": c.name, "peer": c.kind, "decode_ms": med, "ratio": base / med,
            "max_abs_error": float(np.max(np.abs(sample.astype(np.float64) - reference))),
            "psnr_db": psnr(reference, sample), "max_rss_mib": statistics.median(c.rss),
            "collectives": c.last.get("collectives", 0), "tiles": tiles,
            "decoded_latents": c.last.get("decoded_latents", ""),
        })
    shape = f"1x4x{args.latent}x{args.latent}"
    print(f"### half-width SD AutoencoderKL (widths {args.widths}), latent {shape} -> "
          f"{reference.shape[-2]}x{reference.shape[-1]}, float32 unless noted, {args.rounds} rounds\n")
    print("| configuration | decode ms (median) | speed vs diffusers 1 thread | max abs error vs diffusers | "
          "PSNR dB vs diffusers | max RSS MiB (largest process) | collectives | tiles |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        p = "identical" if math.isinf(row["psnr_db"]) else f"{row['psnr_db']:.1f}"
        tiles = row["tiles"] if not row["decoded_latents"] else f"{row['tiles']} ({row['decoded_latents']} latents)"
        print(f"| {row['name']} | {row['decode_ms']:.0f} | {row['ratio']:.2f}x | {row['max_abs_error']:.1e} | {p} | "
              f"{row['max_rss_mib']:.0f} | {row['collectives']} | {tiles} |")
    distvae = next((c for c in configs if c.kind == "distvae"), None)
    if distvae and distvae.last.get("collectives_by_kind"):
        print(f"\nDistVAE's collectives by kind (rank 0, one decode): {distvae.last['collectives_by_kind']}")
    print(f"vaedecode's estimate for a 32-latent floor tile: {floor_mib:.1f} MiB (with 25% headroom); "
          f"tiled budgets {budgets} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": shlex.join(sys.argv), "shape": shape, "widths": args.widths,
                       "rounds": args.rounds, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
