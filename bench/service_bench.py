#!/usr/bin/python3
"""Service overhead, time to first chunk and throughput of vaedecode_server.

Starts vaedecode_server itself (embedded default model, --devices cpu:2
--group_size 2: one group of two ranks, exact sharding), waits until the
model is served, then:

1. For each output size (latent 1x4x32x32 -> 256², 1x4x64x64 -> 512²):
   --requests sequential Decode calls (mode exact, float32) through the
   Python client (client/python/vaedecode_client.py), recording the latency
   the client observes (call to end of stream), the time to the first Chunk
   and the trailer's decode_ms. The in-process reference is the `vaedecode`
   CLI decoding the same latent file the same way (`decode --mode exact
   --ranks 2 --threads 1`, its printed decode_ms); a few CLI runs are
   interleaved between the service requests so machine noise hits both alike.
   Overhead = p50 client latency / p50 in-process decode; also the p50 of
   (client latency - trailer decode_ms), what the service adds around the
   decode it reports.
2. Throughput with 1/4/8 concurrent clients (threads, one channel each,
   --throughput-requests calls each at 256²): requests/s over the wall time.

Prints Markdown tables and writes every sample to OUT_DIR/service_bench.json.

    bazel build //:vaedecode //:vaedecode_server //worker:vaedecode_worker
    /usr/bin/python3 bench/service_bench.py                   # the full run (50 requests per size)
    /usr/bin/python3 bench/service_bench.py --requests 3 --sizes 16 --concurrency 1,2 --throughput-requests 2

Needs Debian's python3-grpcio and python3-numpy (/usr/bin/python3). The gRPC
stubs come from the client's loader: $VAEDECODE_PY_STUBS (e.g.
$(bazel info bazel-bin)/client/python after `bazel build
//client/python:stubs`), else they are generated with protoc +
grpc_python_plugin into a temporary folder. Binaries are taken from --bin
(default: `bazel info bazel-bin`).
"""
import argparse
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
import vaedecode_client as vc  # noqa: E402  pylint: disable=wrong-import-position

pb2, pb2_grpc = vc.pb2, vc.pb2_grpc


def percentile(values, q):
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def bazel_bin():
    out = subprocess.run(["bazel", "info", "bazel-bin"], cwd=REPO, capture_output=True, text=True, check=True)
    return out.stdout.strip()


class Server:
    """vaedecode_server on loopback ports the kernel picks, drained with SIGTERM."""

    def __init__(self, args):
        self.ready = os.path.join(args.out_dir, "server.ready")
        if os.path.exists(self.ready):
            os.remove(self.ready)
        self.log = open(os.path.join(args.out_dir, "server.log"), "w")  # pylint: disable=consider-using-with
        cmd = [os.path.join(args.bin, "server/vaedecode_server"),
               f"--worker_binary={os.path.join(args.bin, 'worker/vaedecode_worker')}",
               f"--devices={args.devices}", f"--group_size={args.group_size}", f"--threads={args.threads}",
               "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", f"--ready_file={self.ready}"]
        cmd += list(getattr(args, "server_flags", []))
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)  # pylint: disable=consider-using-with
        self.address = None

    def wait_served(self, model, timeout_s=300):
        deadline = time.monotonic() + timeout_s
        while not (os.path.exists(self.ready) and "grpc_port=" in open(self.ready).read()):
            self._check(deadline, "listen")
            time.sleep(0.1)
        port = re.search(r"grpc_port=(\d+)", open(self.ready).read()).group(1)
        self.address = f"127.0.0.1:{port}"
        stub = pb2_grpc.VaeDecoderStub(vc.channel(self.address))
        while True:
            try:
                if any(m.name == model for m in stub.ListModels(pb2.ListModelsRequest(), timeout=5).models):
                    return
            except grpc.RpcError:
                pass
            self._check(deadline, f"serve {model!r}")
            time.sleep(0.5)

    def _check(self, deadline, what):
        if self.proc.poll() is not None:
            sys.exit(f"service_bench: vaedecode_server exited ({self.proc.returncode}); see {self.log.name}")
        if time.monotonic() > deadline:
            self.stop()
            sys.exit(f"service_bench: vaedecode_server did not {what} in time; see {self.log.name}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def cli_decode_ms(args, latent_path):
    """The in-process reference: the CLI's decode_ms for the same latent, same ranks and threads."""
    cmd = [os.path.join(args.bin, "cli/vaedecode"), "decode", "--latent", latent_path,
           "--out", os.path.join(args.out_dir, "cli_out.npy"), "--mode", "exact",
           "--ranks", str(args.group_size), "--threads", str(args.threads)]
    line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    mode = re.search(r"\bmode=(\S+)", line)
    if not mode or mode.group(1) != "exact":
        sys.exit(f"service_bench: the CLI did not decode exactly: {line}")
    return float(re.search(r"\bdecode_ms=([0-9.]+)", line).group(1))


def request_for(latent, args):
    return pb2.DecodeRequest(model=args.model, latent=vc.latent_tensor(latent), mode=vc.MODES[args.mode],
                             output_format=vc.FORMATS[args.format])


def one_call(stub, request):
    r = vc.decode(stub, request)
    t = r.trailer.timings
    return {"client_ms": r.total_s * 1e3, "first_chunk_ms": r.first_chunk_s * 1e3, "decode_ms": t.decode_ms,
            "gather_ms": t.gather_ms, "queue_ms": t.queue_ms, "stream_ms": t.stream_ms,
            "server_total_ms": t.total_ms, "mode": pb2.Mode.Name(r.header.mode), "degree": r.header.degree,
            "chunks": r.chunks, "shape": list(r.header.shape)}


def latency_run(args, server, n):
    """--requests sequential calls at a 1x4xNxN latent with CLI runs interleaved."""
    latent = vc.demo_latent([1, 4, n, n], args.seed)
    latent_path = os.path.join(args.out_dir, f"latent_{n}.npy")
    np.save(latent_path, latent)
    stub = pb2_grpc.VaeDecoderStub(vc.channel(server.address))
    request = request_for(latent, args)
    for _ in range(args.warmup):
        one_call(stub, request)
    cli_decode_ms(args, latent_path)  # warm the page cache for the CLI too
    cli_runs = max(args.cli_runs, 1)
    every = max(1, args.requests // cli_runs)
    calls, cli = [], []
    for i in range(args.requests):
        if i % every == 0 and len(cli) < cli_runs:
            cli.append(cli_decode_ms(args, latent_path))
        calls.append(one_call(stub, request))
        print(f"  {n}x{n} latent: request {i + 1}/{args.requests}: {calls[-1]['client_ms']:.0f} ms", file=sys.stderr)
    while len(cli) < cli_runs:
        cli.append(cli_decode_ms(args, latent_path))
    modes = {(c["mode"], c["degree"]) for c in calls}
    return {"latent": [1, 4, n, n], "output": calls[0]["shape"], "calls": calls, "cli_decode_ms": cli,
            "modes": sorted(f"{m} x{d}" for m, d in modes)}


def throughput_run(args, server, clients):
    """`clients` threads, one channel each, --throughput-requests calls each; wall time from a common start."""
    n = args.throughput_size
    request = request_for(vc.demo_latent([1, 4, n, n], args.seed), args)
    barrier = threading.Barrier(clients + 1)
    latencies, failures, lock = [], [], threading.Lock()

    def client():
        stub = pb2_grpc.VaeDecoderStub(vc.channel(server.address))
        try:
            stub.ListModels(pb2.ListModelsRequest(), timeout=30)  # connect before the clock starts
        except grpc.RpcError:
            barrier.abort()  # the other threads fail at the barrier instead of waiting forever
            raise
        barrier.wait()
        for _ in range(args.throughput_requests):
            try:
                ms = one_call(stub, request)["client_ms"]
                with lock:
                    latencies.append(ms)
            except (grpc.RpcError, vc.StreamError) as e:
                with lock:
                    failures.append(f"{e.code().name}: {e.details()}" if isinstance(e, grpc.RpcError) else str(e))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    print(f"  {clients} clients: {len(latencies)} calls in {wall:.1f} s", file=sys.stderr)
    return {"clients": clients, "latent": [1, 4, n, n], "wall_s": wall, "latencies_ms": latencies,
            "failures": failures, "requests_per_s": len(latencies) / wall}


def print_tables(args, sizes, throughput, server_exit):
    print(f"### vaedecode_server, {args.devices} in groups of {args.group_size} ({args.threads} thread per rank), "
          f"mode {args.mode}, {args.format}, embedded SD-1.x-sized decoder\n")
    print(f"{args.requests} sequential requests per size through the Python client; in-process = the "
          f"`vaedecode` CLI (`decode --mode exact --ranks {args.group_size} --threads {args.threads}`) "
          "on the same latent, interleaved. Times in ms.\n")
    print("| latent → output | mode used | client p50 | client p99 | first chunk p50 | trailer decode p50 "
          "| in-process decode p50 (runs) | overhead (client p50 / in-process p50) | client − trailer decode p50 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in sizes:
        calls = s["calls"]
        client = [c["client_ms"] for c in calls]
        first = [c["first_chunk_ms"] for c in calls]
        dec = [c["decode_ms"] for c in calls]
        extra = [c["client_ms"] - c["decode_ms"] for c in calls]
        cli = percentile(s["cli_decode_ms"], 50)
        out = s["output"]
        print(f"| {'×'.join(map(str, s['latent']))} → {out[-2]}×{out[-1]} | {', '.join(s['modes'])} "
              f"| {percentile(client, 50):.0f} | {percentile(client, 99):.0f} | {percentile(first, 50):.0f} "
              f"| {percentile(dec, 50):.0f} | {cli:.0f} ({len(s['cli_decode_ms'])}) "
              f"| {percentile(client, 50) / cli:.2f}× | {percentile(extra, 50):.0f} |")
    if throughput:
        n = args.throughput_size
        base = throughput[0]["requests_per_s"]
        print(f"\nThroughput at {n * 8}² (latent 1×4×{n}×{n}), {args.throughput_requests} requests per client:\n")
        print("| concurrent clients | requests | wall s | requests/s | vs 1 client | latency p50 ms | latency p99 ms "
              "| failures |")
        print("|---|---|---|---|---|---|---|---|")
        for t in throughput:
            lat = t["latencies_ms"]
            print(f"| {t['clients']} | {len(lat)} | {t['wall_s']:.1f} | {t['requests_per_s']:.3f} "
                  f"| {t['requests_per_s'] / base:.2f}× | {percentile(lat, 50):.0f} | {percentile(lat, 99):.0f} "
                  f"| {len(t['failures'])} |")
    print(f"\nserver exit code after SIGTERM: {server_exit}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="", help="bazel-bin folder with server/, worker/, cli/ (default: bazel info)")
    ap.add_argument("--requests", type=int, default=50, help="sequential requests per size")
    ap.add_argument("--sizes", default="32,64", help="square latents 1x4xNxN (output 8N x 8N)")
    ap.add_argument("--warmup", type=int, default=2, help="unrecorded requests per size")
    ap.add_argument("--cli-runs", type=int, default=5, help="in-process CLI decodes per size, interleaved")
    ap.add_argument("--concurrency", default="1,4,8", help="concurrent clients; empty: no throughput run")
    ap.add_argument("--throughput-requests", type=int, default=6, help="requests per client")
    ap.add_argument("--throughput-size", type=int, default=32, help="latent N of the throughput run")
    ap.add_argument("--devices", default="cpu:2")
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (server and CLI)")
    ap.add_argument("--mode", choices=["exact", "dense", "auto"], default="exact")
    ap.add_argument("--format", choices=["float32", "float16", "uint8", "png"], default="float32")
    ap.add_argument("--model", default="default")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default="/tmp/vaedecode-service-bench")
    args = ap.parse_args()
    args.bin = args.bin or bazel_bin()
    os.makedirs(args.out_dir, exist_ok=True)
    for b in ("server/vaedecode_server", "worker/vaedecode_worker", "cli/vaedecode"):
        if not os.access(os.path.join(args.bin, b), os.X_OK):
            sys.exit(f"service_bench: {os.path.join(args.bin, b)} missing: "
                     "bazel build //:vaedecode //:vaedecode_server //worker:vaedecode_worker")
    info = subprocess.run([os.path.join(args.bin, "cli/vaedecode"), "info"], capture_output=True, text=True).stdout
    libtorch = re.search(r"libtorch: (.*)", info)
    print(f"binaries: {args.bin}; {libtorch.group(1) if libtorch else 'LibTorch ?'}; cpus: {os.cpu_count()}; "
          f"{datetime.date.today()}\n")

    server = Server(args)
    try:
        server.wait_served(args.model)
        print(f"service_bench: serving on {server.address}", file=sys.stderr)
        sizes = [latency_run(args, server, int(n)) for n in args.sizes.split(",") if n]
        concurrency = [int(c) for c in args.concurrency.split(",") if c]
        throughput = [throughput_run(args, server, c) for c in concurrency]
    except grpc.RpcError as e:
        server.stop()
        sys.exit(f"service_bench: {e.code().name}: {e.details()}")
    except BaseException:
        server.stop()
        raise
    server_exit = server.stop()
    with open(os.path.join(args.out_dir, "service_bench.json"), "w") as f:
        json.dump({"args": vars(args), "sizes": sizes, "throughput": throughput, "server_exit": server_exit}, f,
                  indent=1)
    print_tables(args, sizes, throughput, server_exit)
    return 0 if server_exit == 0 and not any(t["failures"] for t in throughput) else 1


if __name__ == "__main__":
    sys.exit(main())
