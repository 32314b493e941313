#!/usr/bin/python3
"""How fast the service recovers from what used to hold a group (issue 13).

Starts vaedecode_server itself (embedded default model, --devices cpu:2
--group_size 2: one group of two ranks) and measures, --trials times each:

1. Hung-rank detection: a long decode runs, rank 1 is SIGSTOPped; the time
   until the client gets UNAVAILABLE, and until the model is SERVING again
   (vaedecode_group_ready back at 1: the group rebuilt), at --heartbeat_timeout_s (the server's flag).
2. Release after a cancel: a long decode (exact over both ranks, then dense
   on the leader) is cancelled by its client after --cancel_after_s; a small
   request sent right after it reports how long it waited for the group (its
   queue_ms), beside the server's own figure (vaedecode_cancel_release_seconds,
   scraped).
3. Memory held by queued requests: while a long decode holds the group,
   --queued requests of a 1x4x128x128 float32 latent (256 KiB) wait; the
   server's RSS grows by so much per queued request (vs the latent's bytes).

Prints Markdown tables and writes the samples to OUT_DIR/reliability_bench.json.

    bazel build //:vaedecode_server //worker:vaedecode_worker
    /usr/bin/python3 bench/reliability_bench.py
    /usr/bin/python3 bench/reliability_bench.py --trials 1 --queued 8     # quick

With --attacks (issue 35), instead: the attacks that took resources without
bound, each on a fresh server (embedded model, cpu:1), for this build and,
with --before_bin, an older one in the same run (its flags must exist there):

4. Release after a cancelled long attention: a 1x4x256x256 latent (one
   attention over 65536 positions) cancelled after --attention_cancel_s; the
   time until a small request sent right then is answered.
5. Compressed bodies: 8 HTTP POSTs of 256 MiB of zeros gzipped (256 KiB each)
   and 4 gRPC calls of a 60 MiB latent of zeros with gzip compression (each
   refused once read: a shape the body does not match, an unknown model); the
   server's peak RSS (VmHWM) above its RSS before.
6. Partial uploads: 20 gRPC calls of a 60 MiB latent through a proxy that
   stops forwarding after 55 MiB; the server's peak RSS above its RSS before,
   over 20 s.

    git worktree add /tmp/before 440874b^ && (cd /tmp/before && bazel build //server:vaedecode_server //worker:vaedecode_worker)
    /usr/bin/python3 bench/reliability_bench.py --attacks --before_bin /tmp/before/bazel-bin

Needs Debian's python3-grpcio and python3-numpy; stubs as in service_bench.py.
"""
import argparse
import datetime
import gzip
import json
import os
import re
import signal
import socket
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request

import grpc
import numpy as np

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
import service_bench as sb  # noqa: E402  pylint: disable=wrong-import-position

vc, pb2, pb2_grpc = sb.vc, sb.pb2, sb.pb2_grpc

LONG = (16, 4, 48, 48)  # the embedded model: seconds on two CPU ranks
SMALL = (1, 4, 8, 8)


LTX2_LONG = (1, 128, 5, 32, 32)  # the ltx2 fixture: 33 frames of 1024x1024, seconds on two CPU ranks
LTX2_SMALL = (1, 128, 1, 2, 2)


def request(shape, seed, request_id="", mode="auto", model="default"):
    latent = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return pb2.DecodeRequest(model=model, latent=vc.latent_tensor(latent), request_id=request_id,
                             mode=vc.MODES[mode])


def workers(server_pid):
    """{rank: pid} of the server's worker processes."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
            ppid = int(stat[stat.rfind(")") + 2:].split()[1])
            cmd = open(f"/proc/{entry}/cmdline").read().split("\0")
        except OSError:
            continue
        if ppid != server_pid:
            continue
        for arg in cmd:
            if arg.startswith("--rank="):
                out[int(arg[len("--rank="):])] = int(entry)
    return out


def rss_bytes(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def scrape(metrics_port, name):
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(rf"^({name}\S*) (\S+)$", body, re.M)}


def wait_running(metrics_port, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if scrape(metrics_port, "vaedecode_in_flight").get("vaedecode_in_flight", 0) >= 1:
            return
        time.sleep(0.02)
    sys.exit("reliability_bench: the long decode never started")


def detection_trial(server, stub, metrics_port, seed):
    before = workers(server.proc.pid)
    call = stub.Decode(request(LONG, seed, "victim"), timeout=120)
    result = {}

    def consume():
        try:
            for _ in call:
                pass
            result["code"] = "OK"
        except grpc.RpcError as e:
            result["code"] = e.code().name
            result["message"] = e.details()
        result["t"] = time.monotonic()

    t = threading.Thread(target=consume)
    t.start()
    wait_running(metrics_port)
    time.sleep(0.3)
    os.kill(before[1], signal.SIGSTOP)
    stopped = time.monotonic()
    t.join()
    answered = result["t"] - stopped
    ready = lambda: scrape(metrics_port, "vaedecode_group_ready").get('vaedecode_group_ready{group="g0"}', 0)
    while ready() != 0:  # the supervisor has taken the group down by the time the call failed
        time.sleep(0.01)
    while ready() != 1:
        time.sleep(0.02)
    return {"code": result["code"], "answered_s": answered, "serving_again_s": time.monotonic() - stopped}


def cancel_trial(stub, metrics_port, cancel_after_s, seed, mode, model="default", shapes=(LONG, SMALL)):
    call = stub.Decode(request(shapes[0], seed, "cancelled", mode, model), timeout=120)  # runs without being read
    wait_running(metrics_port)
    time.sleep(cancel_after_s)
    call.cancel()
    cancelled = time.monotonic()
    reply = vc.decode(stub, request(shapes[1], seed + 1, "after-cancel", model=model))
    return {"next_queue_ms": reply.trailer.timings.queue_ms,
            "next_total_s": time.monotonic() - cancelled}


def ltx2_cancels(args):
    """Exact LTX-2 decodes cancelled after --cancel_after_s, and the same decode uncancelled."""
    repo = os.path.join(args.out_dir, "ltx2-repo")
    os.makedirs(repo, exist_ok=True)
    link = os.path.join(repo, "ltx2")
    if not os.path.lexists(link):
        os.symlink(os.path.realpath(os.path.join(args.fixtures, "ltx2")), link)
    server = sb.Server(argparse.Namespace(**{**vars(args), "server_flags": args.server_flags + [
        f"--model_repository={repo}"]}))
    server.wait_served("ltx2")
    metrics_port = int(re.search(r"metrics_port=(\d+)", open(server.ready).read()).group(1))
    stub = pb2_grpc.VaeDecoderStub(vc.channel(server.address))
    vc.decode(stub, request(LTX2_SMALL, 0, model="ltx2", mode="exact"))  # warm-up
    whole = []
    for i in range(args.trials):
        reply = vc.decode(stub, request(LTX2_LONG, 50 + i, "whole", "exact", "ltx2"))
        whole.append(reply.trailer.timings.decode_ms)
    before = scrape(metrics_port, "vaedecode_cancel_release_seconds")
    trials = [cancel_trial(stub, metrics_port, args.cancel_after_s, 60 + 2 * i, "exact", "ltx2",
                           (LTX2_LONG, LTX2_SMALL)) for i in range(args.trials)]
    release = scrape(metrics_port, "vaedecode_cancel_release_seconds")
    server.stop()
    count = release.get("vaedecode_cancel_release_seconds_count", 0) - before.get(
        "vaedecode_cancel_release_seconds_count", 0)
    total = release.get("vaedecode_cancel_release_seconds_sum", 0) - before.get(
        "vaedecode_cancel_release_seconds_sum", 0)
    return {"whole_decode_ms": whole, "cancels": trials, "release_mean_s": total / count if count else None}


def queued_memory(server, stub, metrics_port, count, seed):
    long_call = stub.Decode(request((64,) + LONG[1:], seed, "holder"), timeout=600)
    wait_running(metrics_port)
    time.sleep(0.5)
    base = rss_bytes(server.proc.pid)
    reqs = [request((1, 4, 128, 128), seed + i, f"queued-{i}") for i in range(count)]
    calls = [stub.Decode(r, timeout=600) for r in reqs]
    deadline = time.monotonic() + 30
    while scrape(metrics_port, "vaedecode_queue_depth").get("vaedecode_queue_depth", 0) < count:
        if time.monotonic() > deadline:
            sys.exit("reliability_bench: the requests never queued")
        time.sleep(0.05)
    time.sleep(0.5)
    held = rss_bytes(server.proc.pid) - base
    for c in calls + [long_call]:
        c.cancel()
    return {"queued": count, "latent_bytes": 4 * 128 * 128 * 4, "rss_growth_bytes": held,
            "per_request_bytes": held / count}


def peak_rss_bytes(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def attack_server(args, bin_dir, name, flags=()):
    """A fresh server of `bin_dir` (embedded model, cpu:1), serving."""
    sub_args = argparse.Namespace(**{**vars(args), "bin": bin_dir, "devices": "cpu:1", "group_size": 1, "threads": 1,
                                     "out_dir": os.path.join(args.out_dir, name), "server_flags": list(flags)})
    os.makedirs(sub_args.out_dir, exist_ok=True)
    server = sb.Server(sub_args)
    server.wait_served("default")
    ready = open(server.ready).read()
    server.metrics_port = int(re.search(r"metrics_port=(\d+)", ready).group(1))
    http = re.search(r"http_port=(\d+)", ready)
    server.http_port = int(http.group(1)) if http else 0
    return server


def long_attention_release(args, bin_dir, name):
    server = attack_server(args, bin_dir, name)
    stub = pb2_grpc.VaeDecoderStub(vc.channel(server.address))
    vc.decode(stub, request(SMALL, 0))  # warm-up
    releases = []
    for i in range(args.trials):
        call = stub.Decode(request((1, 4, 256, 256), 70 + i, "long-attention", "dense"), timeout=3600)
        wait_running(server.metrics_port)
        time.sleep(args.attention_cancel_s)
        call.cancel()
        cancelled = time.monotonic()
        vc.decode(stub, request(SMALL, 80 + i, "after-cancel"))
        releases.append(time.monotonic() - cancelled)
    server.stop()
    return releases


def compressed_bodies(args, bin_dir, name):
    server = attack_server(args, bin_dir, name, ["--http_listen=127.0.0.1:0"])
    base = rss_bytes(server.proc.pid)
    bomb = gzip.compress(b"\0" * (256 << 20))  # 256 KiB: 4x --max_message_bytes once inflated
    answers = []

    def http_post():
        # A shape the body does not match: refused once read, never decoded.
        req = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/?shape=1&shape=4&shape=8&shape=8"
                                     "&dtype=float32", data=bomb, headers={"Content-Encoding": "gzip"})
        try:
            answers.append(urllib.request.urlopen(req, timeout=120).status)
        except urllib.error.HTTPError as e:
            answers.append(e.code)
        except OSError as e:
            answers.append(type(e).__name__)

    latent = np.zeros((1, 4, 1920, 2048), np.float32)  # 60 MiB
    zeros = pb2.DecodeRequest(model="no-such-model", latent=vc.latent_tensor(latent))  # refused once inflated

    def grpc_call():
        channel = grpc.insecure_channel(server.address, options=[("grpc.max_send_message_length", 1 << 30),
                                                                 ("grpc.use_local_subchannel_pool", 1)])
        try:
            for _ in pb2_grpc.VaeDecoderStub(channel).Decode(zeros, timeout=120, compression=grpc.Compression.Gzip):
                pass
            answers.append("OK")
        except grpc.RpcError as e:
            answers.append(e.code().name)

    threads = [threading.Thread(target=http_post) for _ in range(8)] + [
        threading.Thread(target=grpc_call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    peak = peak_rss_bytes(server.proc.pid) - base
    server.stop()
    return {"peak_growth_bytes": peak, "answers": [str(a) for a in answers]}


def partial_uploads(args, bin_dir, name, uploads=20, stop_after=55 << 20):
    server = attack_server(args, bin_dir, name)
    host, port = server.address.split(":")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    stop = threading.Event()

    def pump(src, dst, limit):
        sent = 0
        try:
            while sent < limit:
                data = src.recv(min(65536, limit - sent))
                if not data:
                    return
                dst.sendall(data)
                sent += len(data)
            stop.wait()  # stalled: the connection stays open
        except OSError:
            pass

    def proxy():
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection((host, int(port)))
            threading.Thread(target=pump, args=(client, upstream, stop_after), daemon=True).start()
            threading.Thread(target=pump, args=(upstream, client, 1 << 62), daemon=True).start()

    threading.Thread(target=proxy, daemon=True).start()
    base = rss_bytes(server.proc.pid)
    latent = np.zeros((1, 4, 1920, 2048), np.float32)  # 60 MiB
    big = pb2.DecodeRequest(model="default", latent=vc.latent_tensor(latent))
    codes = []

    def call():
        channel = grpc.insecure_channel(f"127.0.0.1:{listener.getsockname()[1]}", options=[
            ("grpc.max_send_message_length", 1 << 30), ("grpc.use_local_subchannel_pool", 1)])
        try:
            for _ in pb2_grpc.VaeDecoderStub(channel).Decode(big, timeout=20):
                pass
            codes.append("OK")
        except grpc.RpcError as e:
            codes.append(e.code().name)

    threads = [threading.Thread(target=call, daemon=True) for _ in range(uploads)]
    for t in threads:
        t.start()
    # The calls' deadline is 20 s, but a Python client whose stream cannot
    # write its cancel may never return: the wait is bounded here.
    give_up = time.monotonic() + 40
    for t in threads:
        t.join(max(0.0, give_up - time.monotonic()))
    codes += ["no answer"] * (uploads - len(codes))
    peak = peak_rss_bytes(server.proc.pid) - base
    stop.set()
    listener.close()
    server.stop()
    return {"peak_growth_bytes": peak, "codes": codes}


def attacks(args):
    builds = [("after", args.bin)] + ([("before", args.before_bin)] if args.before_bin else [])
    results = {}
    for label, bin_dir in builds:
        results[label] = {
            "release_s": long_attention_release(args, bin_dir, f"{label}-attention"),
            "compressed": compressed_bodies(args, bin_dir, f"{label}-compressed"),
            "partial": partial_uploads(args, bin_dir, f"{label}-partial"),
        }
    med = statistics.median
    labels = [label for label, _ in builds]
    print(f"## Attacks ({datetime.date.today()}, embedded model on cpu:1, {args.trials} trials; "
          + ", ".join(f"{label}: {bin_dir}" for label, bin_dir in builds) + ")\n")
    print("| what | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    print(f"| cancelled 1x4x256x256 decode (attention over 65536 positions) after {args.attention_cancel_s:g} s -> "
          "next request answered (median) | " + " | ".join(f"{med(results[l]['release_s']):.2f} s" for l in labels)
          + " |")
    print("| peak server RSS growth, 8 gzip HTTP bodies (256 MiB inflated) + 4 gzip gRPC calls (60 MiB) | "
          + " | ".join(f"{results[l]['compressed']['peak_growth_bytes'] / 2**20:.0f} MiB" for l in labels) + " |")
    print("| peak server RSS growth, 20 gRPC uploads of 60 MiB stalled after 55 MiB | "
          + " | ".join(f"{results[l]['partial']['peak_growth_bytes'] / 2**20:.0f} MiB" for l in labels) + " |")
    for l in labels:
        print(f"\n{l}: compressed answers {sorted(results[l]['compressed']['answers'])}; "
              f"stalled uploads {sorted(results[l]['partial']['codes'])}")
    with open(os.path.join(args.out_dir, "reliability_attacks.json"), "w") as f:
        json.dump(results, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", default=None)
    parser.add_argument("--out_dir", default="/tmp/vaedecode-reliability-bench")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--queued", type=int, default=32)
    parser.add_argument("--cancel_after_s", type=float, default=0.5)
    parser.add_argument("--heartbeat_timeout_s", type=float, default=5)
    parser.add_argument("--fixtures", default=os.path.join(HERE, "..", "..", "shared", "fixtures"),
                        help="the shared fixtures (for the ltx2 model)")
    parser.add_argument("--attacks", action="store_true", help="issue 35's attacks instead (see above)")
    parser.add_argument("--before_bin", default=None, help="with --attacks: an older build's bazel-bin, side by side")
    parser.add_argument("--attention_cancel_s", type=float, default=3)
    args = parser.parse_args()
    args.bin = args.bin or sb.bazel_bin()
    os.makedirs(args.out_dir, exist_ok=True)
    if args.attacks:
        attacks(args)
        return
    args.devices, args.group_size, args.threads = "cpu:2", 2, 1
    args.server_flags = [f"--heartbeat_timeout_s={args.heartbeat_timeout_s}"]
    server = sb.Server(args)
    server.wait_served("default")
    metrics_port = int(re.search(r"metrics_port=(\d+)", open(server.ready).read()).group(1))
    stub = pb2_grpc.VaeDecoderStub(vc.channel(server.address))
    vc.decode(stub, request(SMALL, 0))  # warm-up

    detection = [detection_trial(server, stub, metrics_port, 10 + i) for i in range(args.trials)]
    stub = pb2_grpc.VaeDecoderStub(vc.channel(server.address))
    cancels = {mode: [cancel_trial(stub, metrics_port, args.cancel_after_s, 20 + 2 * i, mode) for i in range(args.trials)]
               for mode in ("exact", "dense")}
    release = scrape(metrics_port, "vaedecode_cancel_release_seconds")
    memory = queued_memory(server, stub, metrics_port, args.queued, 100)
    code = server.stop()
    ltx2 = ltx2_cancels(args)

    med = statistics.median
    print(f"## Reliability ({datetime.date.today()}, cpu:2 one group of 2, embedded model, "
          f"--heartbeat_timeout_s={args.heartbeat_timeout_s:g}, {args.trials} trials; server exit {code})\n")
    print("| what | median | all |")
    print("|---|---|---|")
    print(f"| stopped rank 1 -> client gets {detection[0]['code']} | {med(d['answered_s'] for d in detection):.2f} s | "
          + ", ".join(f"{d['answered_s']:.2f}" for d in detection) + " |")
    print(f"| stopped rank 1 -> model SERVING again (group rebuilt) | {med(d['serving_again_s'] for d in detection):.2f} s | "
          + ", ".join(f"{d['serving_again_s']:.2f}" for d in detection) + " |")
    for mode, trials in cancels.items():
        print(f"| {mode} decode cancelled after {args.cancel_after_s:g} s -> next request's queue time | "
              f"{med(c['next_queue_ms'] for c in trials):.0f} ms | "
              + ", ".join(f"{c['next_queue_ms']:.0f}" for c in trials) + " |")
    count = release.get("vaedecode_cancel_release_seconds_count", 0)
    if count:
        mean = release["vaedecode_cancel_release_seconds_sum"] / count
        print(f"| cancel -> group free (server's histogram, mean of {count:.0f}) | {mean * 1e3:.0f} ms | |")
    lc = ltx2["cancels"]
    print(f"| exact LTX-2 decode {list(LTX2_LONG)} uncancelled: decode time | {med(ltx2['whole_decode_ms']):.0f} ms | "
          + ", ".join(f"{m:.0f}" for m in ltx2["whole_decode_ms"]) + " |")
    print(f"| exact LTX-2 decode cancelled after {args.cancel_after_s:g} s -> next request's queue time | "
          f"{med(c['next_queue_ms'] for c in lc):.0f} ms | " + ", ".join(f"{c['next_queue_ms']:.0f}" for c in lc) + " |")
    if ltx2["release_mean_s"] is not None:
        print(f"| LTX-2 cancel -> group free (server's histogram, mean of {len(lc)}) | "
              f"{ltx2['release_mean_s'] * 1e3:.0f} ms | |")
    print(f"| server RSS per queued request (latent {memory['latent_bytes'] >> 10} KiB, {memory['queued']} queued) | "
          f"{memory['per_request_bytes'] / 1024:.0f} KiB ({memory['per_request_bytes'] / memory['latent_bytes']:.2f}x the latent) | |")
    with open(os.path.join(args.out_dir, "reliability_bench.json"), "w") as f:
        json.dump({"detection": detection, "cancel": cancels, "release": release, "memory": memory, "ltx2": ltx2}, f, indent=1)


if __name__ == "__main__":
    main()
