"""What each protocol costs on the same decodes: the streaming
vaedecode.v1.Decode, diffusers' remote_decode() over HTTP, and the Open
Inference Protocol through tritonclient.grpc, side by side on one server.

Starts vaedecode_server (embedded default model, --devices cpu:2
--group_size 2: exact sharding over two ranks, --http_listen), waits until
the model is served, then for each latent size sends --requests rounds of
one call per protocol, in turn (so machine noise hits all three alike), each
asking for the float32 decoder output of the same latent:

  grpc   client/python/vaedecode_client.py's decode (streamed row bands)
  http   remote_decode(output_type="pt", return_type="pt", do_scaling=False)
  oip    InferenceServerClient.infer (FP32 "sample", raw_output_contents)

and records the latency the client sees and the group's decode time as the
server reports it (the trailer; the X-Vaedecode-Decode-Ms header; the OIP
reply's decode_ms parameter). Overhead = p50 latency / the gRPC path's p50;
and p50 of (latency - decode_ms), what each protocol adds around the decode.
Every output is checked equal to the gRPC path's.

Run it in the pinned venv (tools/python_env.sh) with the stubs built:

    bazel build //:vaedecode_server //worker:vaedecode_worker //client/python:stubs
    VAEDECODE_PY_STUBS=$(bazel info bazel-bin)/client/python $(tools/python_env.sh) bench/protocol_bench.py
    ... bench/protocol_bench.py --requests 3 --sizes 16     # a quick look

Prints a Markdown table and writes every sample to OUT_DIR/protocol_bench.json.
"""
import argparse
import datetime
import json
import os
import sys
import time

import numpy as np
import torch
import tritonclient.grpc as grpcclient
from diffusers.utils.remote_utils import remote_decode

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import service_bench as sb  # noqa: E402  pylint: disable=wrong-import-position

vc, pb2, pb2_grpc = sb.vc, sb.pb2, sb.pb2_grpc


def grpc_call(stub, latent, args):
    request = pb2.DecodeRequest(model=args.model, latent=vc.latent_tensor(latent), mode=vc.MODES["exact"],
                                output_format=vc.FORMATS["float32"])
    start = time.perf_counter()
    r = vc.decode(stub, request)
    ms = (time.perf_counter() - start) * 1e3
    return ms, r.trailer.timings.decode_ms, r.array


def http_call(endpoint, latent, args):
    tensor = torch.from_numpy(latent)
    start = time.perf_counter()
    out = remote_decode(endpoint, tensor, do_scaling=False, output_type="pt", return_type="pt")
    ms = (time.perf_counter() - start) * 1e3
    # remote_decode returns only the tensor (not its X-Vaedecode-Decode-Ms
    # header): the server's figure comes from its log line (protocol=http).
    return ms, None, out.numpy()


def oip_call(client, latent, args):
    tensor = grpcclient.InferInput("latent", list(latent.shape), "FP32")
    tensor.set_data_from_numpy(latent)
    start = time.perf_counter()
    result = client.infer(args.model, [tensor], parameters={"mode": "exact"})
    ms = (time.perf_counter() - start) * 1e3
    decode_ms = result.get_response().parameters["decode_ms"].double_param
    return ms, decode_ms, result.as_numpy("sample")


def http_decode_ms_from_log(log_path, count):
    """The last `count` protocol=http decode_ms figures of the server's log."""
    figures = []
    for line in open(log_path, encoding="utf-8"):
        if " protocol=http " in line and " status=OK " in line:
            figures.append(float(line.split(" decode_ms=")[1].split()[0]))
    return figures[-count:]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20, help="rounds per size (one call per protocol each)")
    ap.add_argument("--sizes", default="16,32", help="latent sides N (1x4xNxN)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bin", default="")
    ap.add_argument("--out-dir", default=os.path.join(sb.REPO, "out", "protocol_bench"))
    args = ap.parse_args()
    args.bin = args.bin or sb.bazel_bin()
    os.makedirs(args.out_dir, exist_ok=True)
    args.model, args.devices, args.group_size, args.threads = "default", "cpu:2", 2, 1
    args.server_flags = ["--http_listen=127.0.0.1:0"]
    server = sb.Server(args)
    server.wait_served(args.model)
    ready = dict(line.split("=", 1) for line in open(server.ready).read().split())
    endpoint = f"http://127.0.0.1:{ready['http_port']}/models/{args.model}?mode=exact"
    stub = pb2_grpc.VaeDecoderStub(vc.channel(server.address))
    oip = grpcclient.InferenceServerClient(server.address)
    results = []
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            latent = vc.demo_latent([1, 4, n, n], args.seed)
            for _ in range(args.warmup):
                grpc_call(stub, latent, args)
                http_call(endpoint, latent, args)
                oip_call(oip, latent, args)
            samples = {"grpc": [], "http": [], "oip": []}
            for i in range(args.requests):
                g_ms, g_decode, reference = grpc_call(stub, latent, args)
                h_ms, _, h_out = http_call(endpoint, latent, args)
                o_ms, o_decode, o_out = oip_call(oip, latent, args)
                for name, out in (("http", h_out), ("oip", o_out)):
                    if out.shape != reference.shape or np.abs(out - reference).max() > 1e-6:
                        sys.exit(f"protocol_bench: {name}'s output differs from the gRPC path's")
                samples["grpc"].append({"client_ms": g_ms, "decode_ms": g_decode})
                samples["http"].append({"client_ms": h_ms, "decode_ms": None})
                samples["oip"].append({"client_ms": o_ms, "decode_ms": o_decode})
                print(f"  {n}x{n}: round {i + 1}/{args.requests}: grpc {g_ms:.0f} ms, http {h_ms:.0f} ms, "
                      f"oip {o_ms:.0f} ms", file=sys.stderr)
            time.sleep(0.5)  # the last log line
            for sample, decode_ms in zip(samples["http"], http_decode_ms_from_log(server.log.name, args.requests)):
                sample["decode_ms"] = decode_ms
            results.append({"latent": [1, 4, n, n], "output": list(reference.shape), "samples": samples})
    finally:
        oip.close()
        server.stop()

    print("| latent → output | protocol | client p50 ms | client p99 ms | vs gRPC p50 | client − server decode p50 ms |")
    print("|---|---|---|---|---|---|")
    for r in results:
        base = sb.percentile([s["client_ms"] for s in r["samples"]["grpc"]], 50)
        for name in ("grpc", "http", "oip"):
            s = r["samples"][name]
            p50 = sb.percentile([x["client_ms"] for x in s], 50)
            p99 = sb.percentile([x["client_ms"] for x in s], 99)
            added = sb.percentile([x["client_ms"] - x["decode_ms"] for x in s if x["decode_ms"] is not None], 50)
            side = r["output"][-1]
            print(f"| 1×4×{r['latent'][2]}×{r['latent'][3]} → {side}² | {name} | {p50:.0f} | {p99:.0f} | "
                  f"{p50 / base:.3f}× | {added:.1f} |")
    with open(os.path.join(args.out_dir, "protocol_bench.json"), "w", encoding="utf-8") as f:
        json.dump({"when": datetime.datetime.now().isoformat(), "args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
