"""The HTTP endpoint against requests that used to crash it, cost a decode
for nothing, or get a wrong answer: curl, diffusers' own remote_decode and
plain requests, against a real vaedecode_server with a 1 MiB limit on a
unary reply and a 2 MiB limit on a request.

  - a packed shape whose byte count overflows int64 is a 400 naming the
    shape, and the server (HTTP and gRPC) keeps serving;
  - a reply predicted over --max_call_output_mib is refused at admission:
    no group ever takes the job;
  - a client that closes its connection cancels its decode (logged and
    counted CANCELLED, the group freed);
  - curl's default Content-Type (a form) is read as raw bytes; a body over
    --max_message_bytes names that flag and its value, chunked or gzip
    bodies included (counted as they arrive, after inflating);
  - /models/NAME/ (trailing slash) is /models/NAME; FLUX.2's flattened
    packed latent; pt replies in float16;
  - the HTTP library's own refusals say what is wrong: multipart (415), a
    request line over its limit (414), a method the path does not take (405);
  - headers over 64 KiB are refused (431); slow and idle connections are bounded (--max_queue=8: 16 connections):
    headers trickled a byte at a time are cut at --http_header_timeout_s and
    a trickled body at --http_body_timeout_s (408, naming the flag), and a
    connection beyond the bound gets 503 at once; then HTTP serves again.
"""

import gzip
import socket
import subprocess
import threading
import sys
import time
import types

import numpy as np
import requests
import safetensors.torch
import torch
from diffusers.utils.remote_utils import remote_decode

from protocol_harness import TMP, Checks, Server, fixture

MAX_REQUEST = 2 << 20  # --max_message_bytes
CONNECTIONS = 16  # the HTTP port's connection bound: --max_queue=8, plus 8
WIRE_TIMEOUT_S = 4  # --http_header_timeout_s and --http_body_timeout_s


def load(path):
    tensors = safetensors.torch.load_file(str(path))
    return next(iter(tensors.values())) if len(tensors) == 1 else tensors["latent"]


def max_diff(a, b):
    return (a.double() - b.double()).abs().max().item()


def metric(server, name, *pieces):
    """Sum of the samples of `name` whose labels contain every piece; -1 if none."""
    total, found = 0.0, False
    for line in server.scrape().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(p in line for p in pieces):
                total += float(line.rsplit(" ", 1)[1])
                found = True
    return total if found else -1


def wait_for(condition, what, timeout_s=120):
    """Polls `condition` (a bound on waiting, not a speed assertion)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def main():
    server = Server({"flux1": "flux1_kl", "flux2": "flux2_kl"},
                    extra_flags=[f"--max_message_bytes={MAX_REQUEST}", "--chunk_bytes=262144",
                                 "--max_call_output_mib=1", "--max_queue=8",
                                 f"--http_header_timeout_s={WIRE_TIMEOUT_S}",
                                 f"--http_body_timeout_s={WIRE_TIMEOUT_S}"])
    flux = f"{server.http}/models/flux1"
    checks = Checks("http_robustness")
    expected = load(fixture("flux1_kl", "expected.safetensors"))
    vae_latent = load(fixture("flux1_kl", "latent.safetensors"))

    def still_serving():
        out = remote_decode(flux, vae_latent, do_scaling=False, output_type="pt", return_type="pt")
        assert max_diff(out, expected) <= 1e-4, max_diff(out, expected)
        server.client("--model=flux1", f"--latent={fixture('flux1_kl', 'latent.safetensors')}",
                      f"--out={TMP / 'still.npy'}")

    def packed_shape_that_overflows_is_refused():
        # The request: 2^62 x 1 x 4 float32 elements make 2^66 bytes, 0 in int64.
        for query in ("shape=4611686018427387904&shape=1&shape=4&dtype=float32&height=16&width=16",
                      "shape=1&shape=4611686018427387904&shape=64&dtype=float32&height=16&width=16",
                      "shape=1&shape=1&shape=64&dtype=float32&height=9223372036854775807&width=9223372036854775807"):
            done = subprocess.run(["curl", "-s", "-o", str(TMP / "overflow.json"), "-w", "%{http_code}", "-X", "POST",
                                   "--data-binary", "", f"{flux}?{query}"], capture_output=True, text=True)
            assert done.returncode == 0, f"curl exited {done.returncode}: the server went down? {done.stderr}"
            assert done.stdout == "400", (query, done.stdout)
            body = (TMP / "overflow.json").read_text()
            assert "shape" in body and "INVALID_ARGUMENT" in body, body
        assert server.proc.poll() is None, "the server exited"
        still_serving()

    def reply_over_the_limit_is_refused_before_decoding():
        taken = metric(server, "vaedecode_queue_seconds_count")
        big = torch.randn(1, 16, 48, 48)  # pt: [1, 3, 384, 384] float32, 1.7 MiB
        try:
            remote_decode(flux, big, do_scaling=False, output_type="pt", return_type="pt")
            raise AssertionError("a reply over --max_call_output_mib was decoded")
        except RuntimeError as e:
            refusal = str(e)
        # No group took the job: the refusal came at admission.
        assert metric(server, "vaedecode_queue_seconds_count") == taken, "a group decoded the refused request"
        assert "RESOURCE_EXHAUSTED" in refusal and "1.7 MiB" in refusal and "1.0 MiB" in refusal, refusal
        assert metric(server, "vaedecode_rejected_requests_total", 'reason="output_too_large"') == 1

    def a_client_that_leaves_cancels_its_decode():
        cancelled = max(0, metric(server, "vaedecode_requests_total", 'protocol="http"', 'status="CANCELLED"'))
        # A decode of seconds (a 1408x1408 JPEG from a float16 latent under the
        # 2 MiB request limit; about 2 s here, 1 s on a fast machine),
        # abandoned after 0.5 s.
        latent = torch.randn(1, 16, 176, 176, dtype=torch.float16)
        (TMP / "long.bin").write_bytes(latent.numpy().tobytes())
        shape = "&".join(f"shape={d}" for d in latent.shape)
        done = subprocess.run(["curl", "-s", "-m", "0.5", "-X", "POST", "-H", "Content-Type: tensor/binary",
                               "--data-binary", f"@{TMP / 'long.bin'}",
                               f"{flux}?{shape}&dtype=float16&do_scaling=False&jpeg_quality=5"],
                              capture_output=True)
        assert done.returncode == 28, f"curl exited {done.returncode}, not its timeout: the decode was too quick"
        wait_for(lambda: metric(server, "vaedecode_requests_total", 'protocol="http"',
                                'status="CANCELLED"') == cancelled + 1, "the abandoned request was cancelled")
        log = server.log_path.read_text()
        assert "the HTTP client closed its connection" in log, "no log line for the cancelled request"
        still_serving()

    def curl_default_content_type_is_read_as_bytes():
        latent = torch.randn(1, 16, 32, 32)  # 64 KiB
        (TMP / "form.bin").write_bytes(latent.numpy().tobytes())
        shape = "&".join(f"shape={d}" for d in latent.shape)
        out = TMP / "form.png"
        done = subprocess.run(["curl", "-s", "-o", str(out), "-w", "%{http_code}", "--data-binary",
                               f"@{TMP / 'form.bin'}", f"{flux}?{shape}&dtype=float32&do_scaling=False"
                               "&output_type=pil&image_format=png"], capture_output=True, text=True)
        assert done.stdout == "200", (done.stdout, out.read_bytes()[:300])
        assert out.read_bytes().startswith(b"\x89PNG"), out.read_bytes()[:300]
        # Over the limit: the message names the flag and its value.
        too_big = TMP / "big.bin"
        too_big.write_bytes(b"\0" * (MAX_REQUEST + 4096))
        done = subprocess.run(["curl", "-s", "-o", str(TMP / "big.json"), "-w", "%{http_code}", "--data-binary",
                               f"@{too_big}", f"{flux}?shape=1&dtype=float32"], capture_output=True, text=True)
        body = (TMP / "big.json").read_text()
        assert done.stdout == "413" and f"--max_message_bytes={MAX_REQUEST}" in body, (done.stdout, body)

    def chunked_and_compressed_bodies_meet_the_same_limit():
        # A chunked body (no Content-Length) and a gzip body that inflates
        # past the limit are refused like a plain one, while being read:
        # before, both were read whole (256 MiB chunked, 2 GB from 1 MiB of
        # gzip) and failed later, if at all.
        def chunks():
            for _ in range(16):
                yield b"\0" * (1 << 20)
        chunked = requests.post(f"{flux}?shape=1&dtype=float32", data=chunks())
        assert chunked.status_code == 413 and f"--max_message_bytes={MAX_REQUEST}" in chunked.json()["error"], (
            chunked.status_code, chunked.text)
        bomb = gzip.compress(b"\0" * (64 << 20))
        assert len(bomb) < MAX_REQUEST
        inflated = requests.post(f"{flux}?shape=1&dtype=float32", data=bomb, headers={"Content-Encoding": "gzip"})
        assert inflated.status_code == 413 and f"--max_message_bytes={MAX_REQUEST}" in inflated.json()["error"], (
            inflated.status_code, inflated.text)
        still_serving()

    def trailing_slash_is_the_same_endpoint():
        out = remote_decode(f"{flux}/", vae_latent, do_scaling=False, output_type="pt", return_type="pt")
        assert max_diff(out, expected) <= 1e-4

    def flux2_packing_and_float16_replies():
        # FLUX.2: Flux2Pipeline._pack_latents flattens the raw [B, 128, h, w] latent.
        raw = load(fixture("flux2_kl", "pipeline_latent.safetensors"))
        b, c, h, w = raw.shape
        packed = raw.reshape(b, c, h * w).permute(0, 2, 1).contiguous()
        flux2_expected = load(fixture("flux2_kl", "expected.safetensors"))
        out = remote_decode(f"{server.http}/models/flux2/", packed, height=16 * h, width=16 * w, output_type="pt",
                            return_type="pt")
        assert tuple(out.shape) == tuple(flux2_expected.shape), (out.shape, flux2_expected.shape)
        assert max_diff(out, flux2_expected) <= 1e-4, max_diff(out, flux2_expected)
        # pt in float16 on request, as the hosted endpoints answer.
        half = remote_decode(f"{flux}?output_dtype=float16", vae_latent, do_scaling=False, output_type="pt",
                             return_type="pt")
        assert half.dtype == torch.float16, half.dtype
        assert max_diff(half, expected) <= 2e-3, max_diff(half, expected)

    def library_refusals_say_what_is_wrong():
        multipart = requests.post(f"{flux}?shape=1&dtype=float32", files={"latent": ("z.bin", b"\0" * 64)})
        assert multipart.status_code == 415 and "multipart" in multipart.json()["error"], multipart.text
        long_uri = requests.post(f"{flux}?" + "shape=1&" * 1200 + "dtype=float32", data=b"\0" * 4)
        assert long_uri.status_code == 414, long_uri.status_code
        assert "8192" in long_uri.json()["error"] and long_uri.json()["code"] == "RESOURCE_EXHAUSTED", long_uri.text
        put = requests.put(flux, data=b"\0" * 64)
        assert put.status_code == 405 and put.headers.get("Allow") == "POST", (put.status_code, put.headers)
        assert "takes POST" in put.json()["error"], put.text
        still_serving()

    def oversized_headers_are_refused():
        # 80 KiB of header lines (each under the library's 8 KiB line limit):
        # before, only the header deadline bounded them.
        big = {f"X-Big-{i}": "a" * 8000 for i in range(10)}
        refused = requests.get(f"{server.http}/health", headers=big, timeout=30)
        assert refused.status_code == 431 and "64 KiB" in refused.json()["error"], (refused.status_code, refused.text)
        assert requests.get(f"{server.http}/health", timeout=30).status_code == 200

    def slow_and_extra_connections_are_cut_and_refused():
        port = int(server.http.rsplit(":", 1)[1])
        stop = threading.Event()

        def trickle(sock, head, body=b""):
            # A byte every 0.2 s: never silent for long, so a per-recv timeout
            # never fires (what held the port before).
            sock.sendall(head)
            for byte in (body or b"X-Slow: 1\r\n" * 100):
                if stop.is_set():
                    return
                try:
                    sock.send(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.2)

        def reply(sock, timeout_s):
            sock.settimeout(timeout_s)
            data = b""
            try:
                while chunk := sock.recv(65536):
                    data += chunk
            except (TimeoutError, ConnectionResetError):
                pass
            return data.decode(errors="replace")

        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(CONNECTIONS)]
        for i, sock in enumerate(slow):
            if i % 2:
                head, body = b"GET /health HTTP/1.1\r\nHost: x\r\n", b""
            else:
                head = (f"POST /models/flux1?shape=1&dtype=float32 HTTP/1.1\r\nHost: x\r\n"
                        f"Content-Length: 1000\r\n\r\n").encode()
                body = b"\0" * 1000
            threading.Thread(target=trickle, args=(sock, head, body), daemon=True).start()
        time.sleep(WIRE_TIMEOUT_S / 2)  # every slow connection is on a server thread (a loaded machine is slow)
        extra = socket.create_connection(("127.0.0.1", port))
        extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        refused = reply(extra, 5)
        assert refused.startswith("HTTP/1.1 503") and f"at most {CONNECTIONS} connections" in refused, refused
        assert metric(server, "vaedecode_http_connections") == CONNECTIONS, metric(server, "vaedecode_http_connections")
        assert metric(server, "vaedecode_http_connections_refused_total") >= 1
        answers = [reply(sock, 4 * WIRE_TIMEOUT_S + 10) for sock in slow]
        stop.set()
        for i, answer in enumerate(answers):
            flag = "--http_body_timeout_s" if i % 2 == 0 else "--http_header_timeout_s"
            assert answer.startswith("HTTP/1.1 408") and flag in answer, (i, answer[:400])
        for sock in slow + [extra]:
            sock.close()
        assert requests.get(f"{server.http}/health", timeout=30).status_code == 200
        still_serving()

    for name, fn in list(locals().items()):  # the checks above, in order
        if isinstance(fn, types.FunctionType) and name != "still_serving" and fn.__code__.co_argcount == 0:
            checks.run(name, fn)
    server.stop()
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
