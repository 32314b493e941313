"""A streaming DecodeSession against one whole-clip Decode, through vaedecode_server (gRPC).

The service-level counterpart of bench/session_bench.py (which runs both through the CLI): a
real vaedecode_server (service_bench's Server: one group of 2 ranks, 1 thread per worker, loopback
ports) serves the Wan 2.1-sized decoder of bench/models/wan21 (base_dim 96) with weights diffusers
seeds (torch.manual_seed(0)) and save_pretrained writes once into OUT/models/wan21 (reused after).
Per round, for each mode (the request's: exact on the group's 2 ranks, dense on one), on a seeded
1x16xTxNxN latent (VAE latent space, float32 out), interleaved:

- whole clip at the end: one Decode through the Python client; the call's time (to its last frame)
  and its first Chunk (video frames stream as they are decoded);
- session: one DecodeSession, 1 latent frame a chunk, each sent once the chunk before it has its
  ChunkTrailer (as a generator would): time from the call (the open) to the first Chunk, the
  steady per-chunk latency (median over chunks 1.. of the time between consecutive ChunkTrailers:
  send, queue, decode, stream), the whole call, and the state each rank holds between chunks (the
  ChunkTrailers' state_bytes_per_rank, largest over the chunks).

The session's frames must equal the Decode's (dense byte for byte, exact within 3e-5). A second
table has the server's own figures (trailer timings). Medians over rounds, in ms.

    $(tools/python_env.sh) bench/session_service_bench.py [--latent 16] [--frames 5] [--rounds 2]

Needs the pinned venv (tools/python_env.sh: diffusers and torch write the weights; grpcio and
numpy for the client) and the built //:vaedecode_server and //worker:vaedecode_worker (--bin).
"""
import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
import types

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
import service_bench as sb  # noqa: E402  pylint: disable=wrong-import-position

vc, pb2, pb2_grpc = sb.vc, sb.pb2, sb.pb2_grpc

WRITE_MODEL = """
import json, sys, torch, diffusers
config = {k: v for k, v in json.load(open(sys.argv[1])).items() if not k.startswith("_")}
torch.manual_seed(0)
diffusers.AutoencoderKLWan(**config).save_pretrained(sys.argv[2])
"""


def model_repository(args):
    """OUT/models/wan21: the config's model with seeded weights, written once by diffusers."""
    repo = os.path.join(args.out, "models")
    folder = os.path.join(repo, "wan21")
    if not os.path.exists(os.path.join(folder, "diffusion_pytorch_model.safetensors")):
        partial = folder + ".partial"
        subprocess.run(["rm", "-rf", partial], check=True)
        print(f"writing {folder} with diffusers (seeded weights)", file=sys.stderr)
        subprocess.run([sys.executable, "-c", WRITE_MODEL, os.path.join(args.model, "config.json"), partial],
                       check=True)
        os.replace(partial, folder)
    return repo


def whole(stub, request):
    r = vc.decode(stub, request)
    return r, {"total": r.total_s * 1e3, "first": r.first_chunk_s * 1e3, "server": r.trailer.timings.decode_ms}


def session(stub, request, frames):
    arrived = []  # client time of each ChunkTrailer
    r = vc.decode_session(stub, request, [1] * frames, on_chunk=lambda t: arrived.append(time.perf_counter()))
    between = np.diff(arrived) * 1e3
    decode = [t.timings.decode_ms for t in r.chunk_trailers]
    state = np.max([list(t.state_bytes_per_rank) for t in r.chunk_trailers], axis=0) / (1 << 20)
    return r, {"first": r.first_chunk_s * 1e3, "steady": float(np.median(between)), "total": r.total_s * 1e3,
               "state": "[" + ",".join(f"{s:.1f}" for s in state) + "]", "server_first": decode[0],
               "server_steady": statistics.median(decode[1:]), "server_sum": sum(decode)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(REPO, "bazel-bin"), help="folder with server/ and worker/")
    ap.add_argument("--model", default=os.path.join(REPO, "bench/models/wan21"), help="folder of its config.json")
    ap.add_argument("--latent", type=int, default=16, help="latent side (pixels: 8x)")
    ap.add_argument("--frames", type=int, default=5, help="latent frames (video: 1 + 4(T-1) frames), at least 2")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--modes", default="exact,dense", help="the requests' modes, in this order each round")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--out", default="/tmp/vaedecode-session-service-bench")
    args = ap.parse_args()
    if args.frames < 2:
        ap.error("--frames: at least 2 (a first chunk and a steady one)")
    os.makedirs(args.out, exist_ok=True)
    print("command: " + shlex.join([sys.executable] + sys.argv) + "\n")
    repo = model_repository(args)
    latent = vc.demo_latent([1, 16, args.frames, args.latent, args.latent], args.seed)
    modes = [m for m in args.modes.split(",") if m]
    rows = {m: [] for m in modes}  # per round: (whole's figures, session's figures)
    used = {}

    server = sb.Server(types.SimpleNamespace(out_dir=args.out, bin=args.bin, devices="cpu:2", group_size=2,
                                             threads=1, server_flags=[f"--model_repository={repo}"]))
    try:
        server.wait_served("wan21")
        stub = pb2_grpc.VaeDecoderStub(vc.channel(server.address))
        for i in range(args.rounds):
            for m in modes:
                request = pb2.DecodeRequest(model="wan21", latent=vc.latent_tensor(latent), mode=vc.MODES[m],
                                            latent_space=pb2.LATENT_SPACE_VAE, output_format=pb2.OUTPUT_FLOAT32)
                w, wf = whole(stub, request)
                s, sf = session(stub, request, args.frames)
                diff = float(np.abs(w.array.astype(np.float64) - s.array).max())
                same = np.array_equal(w.array, s.array) if m == "dense" else diff <= 3e-5
                if w.array.shape != s.array.shape or not np.isfinite(w.array).all() or not same:
                    raise SystemExit(f"{m}: the session's frames differ from the whole clip's "
                                     f"(shapes {w.array.shape} {s.array.shape}, max |diff| {diff})")
                used[m] = (pb2.Mode.Name(w.header.mode), w.header.degree, pb2.Mode.Name(s.header.mode),
                           s.header.degree, list(w.header.shape))
                rows[m].append((wf, sf))
                print(f"  round {i + 1}/{args.rounds} {m}: whole {wf['total']:.0f} ms, session first frame "
                      f"{sf['first']:.0f} ms, steady {sf['steady']:.0f} ms, max |session - whole| {diff:.1e}",
                      file=sys.stderr)
    finally:
        code = server.stop()

    def med(m, part, key):
        return statistics.median(r[part][key] for r in rows[m])

    shape = used[modes[0]][4]
    print(f"### vaedecode_server (1 group of 2 ranks, 1 thread per worker), bench/models/wan21 (seeded by diffusers), "
          f"latent [1,16,{args.frames},{args.latent},{args.latent}] -> {shape[2]} frames of {shape[3]}x{shape[4]}, "
          f"float32, {args.rounds} rounds\n")
    # Both count from their call: the whole clip's call can start only once the generator made its last
    # latent frame, the session's once it made its first.
    print("| configuration | whole clip at the end: first frame, last frame after its call (ms) | "
          "session: time to first frame (ms) | session: steady per chunk (ms) | session: all chunks (ms) | "
          "state per rank between chunks (MiB) |")
    print("|---|---|---|---|---|---|")
    names = {}
    for m in modes:
        wm, wd, sm, sd, _ = used[m]
        names[m] = f"{m} ({wm} x{wd}" + ("" if (wm, wd) == (sm, sd) else f", session {sm} x{sd}") + ")"
        print(f"| {names[m]} | {med(m, 0, 'first'):.0f}, {med(m, 0, 'total'):.0f} | {med(m, 1, 'first'):.0f} | "
              f"{med(m, 1, 'steady'):.0f} | "
              f"{med(m, 1, 'total'):.0f} | {rows[m][-1][1]['state']} |")
    print("\nThe server's figures (trailer decode_ms) and the whole Decode's first Chunk:\n")
    print("| configuration | whole Decode: first chunk (ms) | whole Decode: decode (ms) | session chunk 0: decode (ms) "
          "| session later chunks: decode, median (ms) | session chunks: decode, sum (ms) |")
    print("|---|---|---|---|---|---|")
    for m in modes:
        print(f"| {names[m]} | {med(m, 0, 'first'):.0f} | {med(m, 0, 'server'):.0f} | {med(m, 1, 'server_first'):.0f} "
              f"| {med(m, 1, 'server_steady'):.0f} | {med(m, 1, 'server_sum'):.0f} |")
    print(f"\nserver exit code after SIGTERM: {code}")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
