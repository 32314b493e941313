#!/usr/bin/python3
"""Time to first chunk against the whole call, through vaedecode_server on a 2-rank exact group.

Two decodes, each on its own server (--devices cpu:2 --group_size 2, exact mode, float32):

- a 17-frame Wan 2.1 video: the wan21 fixture (../shared/fixtures, diffusers' weights) on a seeded
  1x16x5xNxN latent; the decoder finishes frames chunk by chunk (1, then 4 per latent frame) and
  the leader streams each chunk as soon as it is gathered;
- a 512² image: the embedded SD-1.x-sized decoder on a seeded 1x4x64x64 latent; the leader
  streams its own band while the other rank's rows arrive.

For each: --requests sequential calls through the Python client (after one warm-up call), the
median time from the call to its first Chunk and to the end of the stream, their ratio, and the
trailer's decode_ms. Reuses service_bench's Server (real worker processes on loopback).

    bazel build //:vaedecode_server //worker:vaedecode_worker
    /usr/bin/python3 bench/first_chunk_bench.py [--requests 5] [--wan-latent 32]
"""
import argparse
import os
import shlex
import statistics
import sys
import types

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
import service_bench as sb  # noqa: E402  pylint: disable=wrong-import-position

vc, pb2, pb2_grpc = sb.vc, sb.pb2, sb.pb2_grpc


def measure(args, label, model, latent, server_flags):
    server_args = types.SimpleNamespace(out_dir=args.out_dir, bin=args.bin, devices="cpu:2", group_size=2,
                                        threads=args.threads, server_flags=server_flags)
    server = sb.Server(server_args)
    try:
        server.wait_served(model)
        stub = pb2_grpc.VaeDecoderStub(vc.channel(server.address))
        request = pb2.DecodeRequest(model=model, latent=vc.latent_tensor(latent), mode=vc.MODES["exact"],
                                    output_format=vc.FORMATS["float32"])
        sb.one_call(stub, request)  # warm-up
        calls = []
        for i in range(args.requests):
            calls.append(sb.one_call(stub, request))
            print(f"  {label}: request {i + 1}/{args.requests}: first chunk {calls[-1]['first_chunk_ms']:.0f} ms "
                  f"of {calls[-1]['client_ms']:.0f} ms", file=sys.stderr)
    finally:
        code = server.stop()
    first = statistics.median(c["first_chunk_ms"] for c in calls)
    total = statistics.median(c["client_ms"] for c in calls)
    return {"label": label, "latent": list(latent.shape), "output": calls[0]["shape"], "mode": calls[0]["mode"],
            "degree": calls[0]["degree"], "chunks": calls[0]["chunks"], "first_ms": first, "total_ms": total,
            "decode_ms": statistics.median(c["decode_ms"] for c in calls), "exit": code}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="", help="bazel-bin folder with server/ and worker/ (default: bazel info)")
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--wan-latent", type=int, default=32, help="Wan latent height and width N (1x16x5xNxN)")
    ap.add_argument("--fixtures", default=os.path.join(REPO, "..", "shared", "fixtures"))
    ap.add_argument("--out-dir", default="/tmp/vaedecode-first-chunk-bench")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.bin = args.bin or sb.bazel_bin()
    os.makedirs(args.out_dir, exist_ok=True)
    print("command: " + shlex.join([sys.executable] + sys.argv) + "\n")

    repo = os.path.join(args.out_dir, "models")
    os.makedirs(repo, exist_ok=True)
    link = os.path.join(repo, "wan21")
    if not os.path.islink(link):
        os.symlink(os.path.realpath(os.path.join(args.fixtures, "wan21")), link)
    n = args.wan_latent
    rows = [
        measure(args, "Wan 2.1 (fixture), 17 frames", "wan21", vc.demo_latent([1, 16, 5, n, n], args.seed),
                [f"--model_repository={repo}"]),
        measure(args, "SD-1.x-sized (embedded), 512²", "default", vc.demo_latent([1, 4, 64, 64], args.seed), []),
    ]
    print(f"vaedecode_server --devices=cpu:2 --group_size=2 --threads={args.threads}, mode exact, float32, "
          f"{args.requests} sequential requests each (medians, ms):\n")
    print("| decode | latent → output | mode | chunks | first chunk | whole call | first / whole | trailer decode |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['label']} | {'×'.join(map(str, r['latent']))} → {'×'.join(map(str, r['output']))} "
              f"| {r['mode']} ×{r['degree']} | {r['chunks']} | {r['first_ms']:.0f} | {r['total_ms']:.0f} "
              f"| {r['first_ms'] / r['total_ms']:.2f} | {r['decode_ms']:.0f} |")
    print(f"\nserver exit codes after SIGTERM: {[r['exit'] for r in rows]}")


if __name__ == "__main__":
    main()
