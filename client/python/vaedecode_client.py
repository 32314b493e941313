#!/usr/bin/python3
"""Decode one latent (or encode one image) through a vaedecode server, in Python.

The Python counterpart of vaedecode_client (client/main.cc), using Debian's
python3-grpcio and python3-numpy with stubs that protoc and
grpc_python_plugin generate from proto/vaedecode/v1/vaedecode.proto:

    /usr/bin/python3 client/python/vaedecode_client.py --server 127.0.0.1:50051 \\
        --latent-shape 1,4,32,32 --seed 0 --out out/py.png
    /usr/bin/python3 client/python/vaedecode_client.py --server … --model sdxl \\
        --latent latent.npy --latent-space raw --mode exact --out image.npy
    /usr/bin/python3 client/python/vaedecode_client.py --server … --model flux \\
        --image photo.png --posterior sample --seed 7 --out latent.npy
    /usr/bin/python3 client/python/vaedecode_client.py --server … --model wan \\
        --latent clip.npy --stream-chunks 1,2,2 --out clip.npy

--stream-chunks sends a video latent through a DecodeSession, that many latent
frames per chunk, each once the chunk before it is decoded (as a generator
would), and writes the clip its frames make (equal to the Decode's).

The stubs are imported from $VAEDECODE_PY_STUBS (e.g.
$(bazel info bazel-bin)/client/python, the genrule's output) or from beside
this file (where `bazel test` runfiles put them); failing both, they are
generated with protoc into a temporary folder removed at exit.

The latent goes out as raw little-endian bytes; the reply is a stream of one
Header, Chunks (row bands of one image/frame; PNG: pieces of one PNG) and one
Trailer. Prints one summary line; errors are one line on stderr with exit
code 1 (2 for bad arguments), gRPC failures as "CODE: message".
"""
import argparse
import atexit
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time

import grpc
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))  # not realpath: runfiles keep stubs beside us
PROTO_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))), "proto")
PROTO = "vaedecode/v1/vaedecode.proto"


def _generate_stubs():
    """protoc + grpc_python_plugin into a temporary folder (removed at exit)."""
    out = tempfile.mkdtemp(prefix="vaedecode-pystubs-")
    atexit.register(shutil.rmtree, out, True)
    subprocess.run(["/usr/bin/protoc", "-I" + PROTO_ROOT, "--python_out=" + out, "--grpc_python_out=" + out,
                    "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
                    os.path.join(PROTO_ROOT, PROTO)], check=True)
    return out


def load_stubs():
    """Returns (vaedecode_pb2, vaedecode_pb2_grpc)."""
    def has_stubs(d):
        return d and os.path.isfile(os.path.join(d, "vaedecode/v1/vaedecode_pb2_grpc.py"))

    for candidate in (os.environ.get("VAEDECODE_PY_STUBS", ""), HERE, _generate_stubs):
        d = candidate() if callable(candidate) else candidate
        if has_stubs(d):
            sys.path.insert(0, d)
            break
    from vaedecode.v1 import vaedecode_pb2, vaedecode_pb2_grpc  # pylint: disable=import-outside-toplevel
    return vaedecode_pb2, vaedecode_pb2_grpc


pb2, pb2_grpc = load_stubs()

MODES = {"auto": pb2.MODE_AUTO, "dense": pb2.MODE_DENSE, "exact": pb2.MODE_EXACT, "tiled": pb2.MODE_TILED}
FORMATS = {"float32": pb2.OUTPUT_FLOAT32, "float16": pb2.OUTPUT_FLOAT16, "uint8": pb2.OUTPUT_UINT8,
           "png": pb2.OUTPUT_PNG}
# Element type of the output, by output format (PNG: the uint8 images the PNGs hold).
OUTPUT_NUMPY = {pb2.OUTPUT_FLOAT32: "<f4", pb2.OUTPUT_FLOAT16: "<f2", pb2.OUTPUT_UINT8: "u1", pb2.OUTPUT_PNG: "u1"}
LATENT_DTYPES = {"float32": pb2.FLOAT32, "float16": pb2.FLOAT16}
POSTERIORS = {"mean": pb2.POSTERIOR_MEAN, "sample": pb2.POSTERIOR_SAMPLE, "moments": pb2.POSTERIOR_MOMENTS}


class StreamError(Exception):
    """The server's stream broke the protocol (not a gRPC status)."""


def channel(server, tls_ca="", tls_cert="", tls_key=""):
    """Plaintext, or TLS when a CA (or a client certificate, for mutual TLS) is given."""
    limit = 256 << 20
    options = [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]
    if not tls_ca and not tls_cert:
        return grpc.insecure_channel(server, options=options)
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    read = lambda path: open(path, "rb").read() if path else None  # noqa: E731
    credentials = grpc.ssl_channel_credentials(root_certificates=read(tls_ca), private_key=read(tls_key),
                                               certificate_chain=read(tls_cert))
    return grpc.secure_channel(server, credentials, options=options)


def wire_array(array):
    """The latent as it is sent: float64 becomes float32; little-endian, C order."""
    if array.dtype.kind == "f" and array.dtype.itemsize == 8:  # float64 in either byte order
        array = array.astype(np.float32)
    if array.dtype.name not in LATENT_DTYPES:
        raise ValueError(f"latent must be float32, float16 or float64, got {array.dtype}")
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))


def latent_tensor(array):
    """A numpy latent as a vaedecode.v1.Tensor: little-endian bytes in C order."""
    array = wire_array(array)
    return pb2.Tensor(dtype=LATENT_DTYPES[array.dtype.name], shape=list(array.shape), data=array.tobytes())


def demo_latent(shape, seed):
    """A seeded N(0, 1) float32 latent (numpy's PCG64: not the C++ client's demo latent)."""
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


class Decoded:
    """One Decode call: the header, the assembled output, the trailer and client-side times."""

    def __init__(self):
        self.header = None
        self.trailer = None
        self.array = None       # tensor formats: the whole output, shaped as the header says
        self.pngs = []          # PNG: one bytes object per image (batch-major, then frame)
        self.chunks = 0
        self.first_chunk_s = None  # seconds from the call to the first Chunk
        self.total_s = None        # seconds from the call to the end of the stream
        self._rows = None

    def add(self, message):
        kind = message.WhichOneof("kind")
        if self.trailer is not None:
            raise StreamError("a message after the trailer")
        if kind == "header":
            if self.header is not None:
                raise StreamError("a second header")
            self._add_header(message.header)
        elif self.header is None:
            raise StreamError(f"a {kind} before the header")
        elif kind == "chunk":
            self._add_chunk(message.chunk)
        elif kind == "trailer":
            self.trailer = message.trailer
        else:
            raise StreamError("an empty message")

    def _add_header(self, h):
        self.header = h
        # [B, C, (T,) H, W] images and clips, or an audio VAE's waveform
        # [B, channels, samples]: its samples are the rows of one column.
        waveform = len(h.shape) == 3 and h.output_format in (pb2.OUTPUT_FLOAT32, pb2.OUTPUT_FLOAT16)
        if (len(h.shape) not in (4, 5) and not waveform) or min(h.shape) < 1:
            raise StreamError(f"header shape {list(h.shape)}")
        if h.output_format not in OUTPUT_NUMPY:
            raise StreamError(f"unknown output format {h.output_format}")
        b = h.shape[0]
        self.channels_last = h.output_format in (pb2.OUTPUT_UINT8, pb2.OUTPUT_PNG)
        self.frames = 1
        if waveform:
            self.channels, self.height, self.width = h.shape[1], h.shape[2], 1
        elif self.channels_last:  # [B, (T,) H, W, C]
            self.height, self.width, self.channels = h.shape[-3:]
            if len(h.shape) == 5:
                self.frames = h.shape[1]
        else:  # [B, C, (T,) H, W]
            self.channels, (self.height, self.width) = h.shape[1], h.shape[-2:]
            if len(h.shape) == 5:
                self.frames = h.shape[2]
        if h.output_format == pb2.OUTPUT_PNG:
            self.pngs = [b""] * (b * self.frames)
            return
        self.array = np.zeros(tuple(h.shape), dtype=OUTPUT_NUMPY[h.output_format])
        self._rows = np.zeros(b * self.frames, dtype=np.int64)

    def _add_chunk(self, c):
        self.chunks += 1
        b, t, r0, r1 = c.batch_index, c.frame, c.row_begin, c.row_end
        if not (0 <= b < self.header.shape[0] and 0 <= t < self.frames):
            raise StreamError(f"chunk: batch {b} frame {t} outside the header's shape")
        image = b * self.frames + t
        if self.header.output_format == pb2.OUTPUT_PNG:
            self.pngs[image] += c.data  # pieces of one PNG arrive in order
            return
        if not 0 <= r0 < r1 <= self.height:
            raise StreamError(f"chunk: rows [{r0}, {r1}) outside [0, {self.height})")
        rows = r1 - r0
        dtype = self.array.dtype
        want = rows * self.width * self.channels * dtype.itemsize
        if len(c.data) != want:
            raise StreamError(f"chunk: {len(c.data)} bytes for rows [{r0}, {r1}), expected {want}")
        band = np.frombuffer(c.data, dtype=dtype)
        if self.channels_last:  # rows [r0, r1) of one [H, W, C] image, contiguous
            view = self.array.reshape(-1, self.frames, self.height, self.width, self.channels)
            view[b, t, r0:r1] = band.reshape(rows, self.width, self.channels)
        else:  # every channel's rows [r0, r1), channel after channel
            view = self.array.reshape(-1, self.channels, self.frames, self.height, self.width)
            view[b, :, t, r0:r1] = band.reshape(self.channels, rows, self.width)
        self._rows[image] += rows

    def finish(self):
        if self.header is None:
            raise StreamError("no header")
        if self.header.output_format == pb2.OUTPUT_PNG:
            missing = [i for i, p in enumerate(self.pngs) if not p]
            if missing:
                raise StreamError(f"PNG {missing[0]} missing")
        elif (self._rows != self.height).any():
            i = int(np.argmax(self._rows != self.height))
            raise StreamError(f"image {i} got {self._rows[i]} of {self.height} rows")
        if self.trailer is None:
            raise StreamError("no trailer")


def decode(stub, request, timeout_s=600.0):
    """Sends one DecodeRequest and assembles the stream; grpc.RpcError on a failed call."""
    start = time.perf_counter()
    return collect(stub.Decode(request, timeout=timeout_s, wait_for_ready=True), start)


def collect(call, start):
    """Assembles a Decode or Encode call's stream into a Decoded; StreamError cancels the call."""
    result = Decoded()
    try:
        for message in call:
            if result.first_chunk_s is None and message.WhichOneof("kind") == "chunk":
                result.first_chunk_s = time.perf_counter() - start
            result.add(message)
    except StreamError:
        call.cancel()
        raise
    result.total_s = time.perf_counter() - start
    result.finish()
    return result


_STOP = object()


def session_requests(request, chunks, ready):
    """A DecodeSession's messages for the whole-latent DecodeRequest `request`: the open, then each chunk of
    `chunks` latent frames once `ready` yields (the session's header, then each chunk's trailer), the last as the
    clip's last_chunk, which ends the session (a model may hold frames for the clip's end)."""
    b, c, t, h, w = request.latent.shape
    yield pb2.SessionRequest(open=pb2.SessionOpen(
        model=request.model, latent_space=request.latent_space, output_format=request.output_format,
        latent_dtype=request.latent.dtype, shape=[b, c, h, w], mode=request.mode, session_id=request.request_id,
        jpeg_quality=request.jpeg_quality))
    frames = np.frombuffer(request.latent.data, dtype=np.uint8).reshape(b * c, t, -1)  # C order: frames per (b, c)
    begin = 0
    for i, n in enumerate(chunks):
        if ready.get() is _STOP:
            return
        part = pb2.Tensor(dtype=request.latent.dtype, shape=[b, c, n, h, w], data=frames[:, begin:begin + n].tobytes())
        yield pb2.SessionRequest(last_chunk=part) if i == len(chunks) - 1 else pb2.SessionRequest(chunk=part)
        begin += n


def decode_session(stub, request, chunks, timeout_s=600.0, on_chunk=None):
    """Decodes `request`'s video latent through one DecodeSession, `chunks` latent frames at a time; the clip
    assembled as a Decode's (a Decoded, .chunk_trailers added). `on_chunk(trailer)` runs on each ChunkTrailer."""
    if len(request.latent.shape) != 5 or sum(chunks) != request.latent.shape[2] or min(chunks) < 1:
        raise ValueError(f"--stream-chunks {','.join(map(str, chunks))}: positive latent frame counts adding up "
                         f"to the latent's {request.latent.shape[2] if len(request.latent.shape) == 5 else 1}")
    noise = request.decode_noise_scale if request.HasField("decode_noise_scale") else request.decode_timestep
    if request.decode_timestep != 0 or noise != 0:  # the noise scale defaults to the timestep
        raise ValueError("a session decodes at the default decode timestep (0) without noise (noise drawn a chunk at "
                         "a time is not the whole clip's): drop decode_timestep and decode_noise_scale, or mix the "
                         "noise into the latent")
    start = time.perf_counter()
    ready = queue.Queue()
    call = stub.DecodeSession(session_requests(request, chunks, ready), timeout=timeout_s, wait_for_ready=True)
    session_header, chunk_messages, chunk_trailers, trailer, first_chunk_s = None, [], [], None, None
    try:
        for message in call:
            kind = message.WhichOneof("kind")
            if trailer is not None:
                raise StreamError("a message after the session's trailer")
            if kind == "session_header" and session_header is None:
                session_header = message.session_header
                ready.put(None)
            elif session_header is None:
                raise StreamError(f"a {kind} before the session header")
            elif kind == "chunk":
                if first_chunk_s is None:
                    first_chunk_s = time.perf_counter() - start
                chunk_messages.append(message)
            elif kind == "chunk_trailer":
                t = message.chunk_trailer
                done = sum(x.frames for x in chunk_trailers)
                if t.chunk != len(chunk_trailers) or t.first_frame != done:
                    raise StreamError(f"chunk trailer {t.chunk} (first frame {t.first_frame}) after {done} frames")
                chunk_trailers.append(t)
                if on_chunk:
                    on_chunk(t)
                ready.put(None)
            elif kind == "trailer":
                trailer = message.trailer
            else:
                raise StreamError(f"a {kind} in a session")
    except StreamError:
        call.cancel()
        raise
    finally:
        for _ in range(len(chunks) + 2):
            ready.put(_STOP)  # the request generator stops waiting
    if session_header is None or trailer is None:
        raise StreamError("the session ended without its header or trailer")
    # The clip as one Decode's stream: a Header with the session's frames, its Chunks, the Trailer.
    h = session_header
    shape = list(h.shape)
    shape[1 if h.output_format in (pb2.OUTPUT_UINT8, pb2.OUTPUT_PNG, pb2.OUTPUT_JPEG) else 2] = trailer.session_frames
    result = Decoded()
    result.add(pb2.DecodeResponse(header=pb2.Header(
        request_id=h.session_id, shape=shape, dtype=h.dtype, output_format=h.output_format, mode=h.mode,
        degree=h.degree, mode_reason=h.mode_reason, frames=trailer.session_frames, height=h.height, width=h.width)))
    for m in chunk_messages:
        result.add(m)
    result.add(pb2.DecodeResponse(trailer=trailer))
    result.finish()
    result.first_chunk_s = first_chunk_s
    result.total_s = time.perf_counter() - start
    result.chunk_trailers = chunk_trailers
    return result


def encode_pieces(request, piece_bytes):
    """The Encode stream's messages: every field in the first, the image's bytes continued by the next."""
    tensor = request.HasField("image")
    data = request.image.data if tensor else request.encoded_image
    for at in range(0, max(len(data), 1), piece_bytes):
        piece = pb2.EncodeRequest()
        if at == 0:
            piece.CopyFrom(request)
        if tensor:
            piece.image.data = data[at:at + piece_bytes]
        else:
            piece.encoded_image = data[at:at + piece_bytes]
        yield piece


def encode(stub, request, timeout_s=600.0, piece_bytes=4 << 20):
    """Streams one EncodeRequest in pieces and assembles the latent (result.array); grpc.RpcError on failure."""
    start = time.perf_counter()
    return collect(stub.Encode(encode_pieces(request, piece_bytes), timeout=timeout_s, wait_for_ready=True), start)


def image_request(path, model):
    """An EncodeRequest for a .png / .jpg / .mp4 file (sent as is) or a .npy image in [-1, 1]."""
    request = pb2.EncodeRequest(model=model)
    if path.endswith((".png", ".jpg", ".jpeg", ".mp4")):
        with open(path, "rb") as f:
            request.encoded_image = f.read()
        return request
    array = np.load(path)
    if array.dtype.kind == "f" and array.dtype.itemsize == 8:
        array = array.astype(np.float32)
    if array.dtype.name not in LATENT_DTYPES:
        raise ValueError(f"{path}: the image must be float32, float16 or float64, got {array.dtype}")
    array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    request.image.CopyFrom(pb2.Tensor(dtype=LATENT_DTYPES[array.dtype.name], shape=list(array.shape),
                                      data=array.tobytes()))
    return request


def write_output(path, result):
    """Writes .npy (tensor formats) or .png files (named like the C++ client); returns the paths."""
    h = result.header
    if h.output_format != pb2.OUTPUT_PNG:
        if not path.endswith(".npy"):
            raise ValueError(f"--out {path}: tensor output needs a .npy path")
        np.save(path, result.array)
        return [path]
    if not path.endswith(".png"):
        raise ValueError(f"--out {path}: PNG output needs a .png path")
    stem, batch, video = path[:-4], h.shape[0], len(h.shape) == 5
    frames = h.shape[1] if video else 1
    written = []
    for b in range(batch):
        for t in range(frames):
            if not video:
                name = path if batch == 1 else f"{stem}_{b}.png"
            else:
                name = f"{stem}_f{t:03d}.png" if batch == 1 else f"{stem}_{b}_f{t:03d}.png"
            with open(name, "wb") as f:
                f.write(result.pngs[b * frames + t])
            written.append(name)
    return written


def parse_args(argv):
    ap = argparse.ArgumentParser(description="Decode one latent through a vaedecode server.")
    ap.add_argument("--server", default="127.0.0.1:50051", help="HOST:PORT")
    ap.add_argument("--model", default="default", help="model name (see --list-models)")
    ap.add_argument("--latent", default="", help=".npy latent; without it a seeded demo latent")
    ap.add_argument("--latent-shape", default="1,4,32,32", help="shape of the demo latent")
    ap.add_argument("--seed", type=int, default=None,
                    help="seed of the demo latent (default 0); with --image, of the posterior sample")
    ap.add_argument("--image", default="", help="encode instead: a .png, .jpg, .mp4 or .npy image ([B, C, (T,) H, W] "
                                                "in [-1, 1]); --out gets the latent as .npy")
    ap.add_argument("--posterior", choices=list(POSTERIORS), default="mean",
                    help="encode: the posterior's mean, a seeded sample, or the moments [B, 2C, ...]")
    ap.add_argument("--save-latent", default="", help="also write the latent sent to this .npy")
    ap.add_argument("--latent-space", choices=["vae", "raw"], default="vae")
    ap.add_argument("--mode", choices=list(MODES), default="auto")
    ap.add_argument("--format", choices=list(FORMATS), default=None,
                    help="output format; default: png for a .png --out, else float32")
    ap.add_argument("--out", default="", help="output .npy (tensor formats) or .png")
    ap.add_argument("--stream-chunks", default="",
                    help="video latents: decode through a streaming session, this many latent frames per chunk (1,2,2)")
    ap.add_argument("--request-id", default="")
    ap.add_argument("--deadline-s", type=float, default=600.0)
    ap.add_argument("--list-models", action="store_true", help="print the server's models and exit")
    ap.add_argument("--tls-ca", default="", help="PEM CAs of the server's certificate: connect over TLS")
    ap.add_argument("--tls-cert", default="", help="PEM client certificate (mutual TLS), with --tls-key")
    ap.add_argument("--tls-key", default="", help="PEM private key of --tls-cert")
    args = ap.parse_args(argv)
    if not args.list_models and not args.out:
        ap.error("--out FILE is required (.npy or .png)")
    if args.image and args.mode == "tiled":
        ap.error("--mode tiled: encodes are dense or exact")
    return args


def run_encode(stub, args, prog):
    """--image: one Encode call, the latent written to --out (.npy)."""
    try:
        request = image_request(args.image, args.model)
    except (OSError, ValueError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if not args.out.endswith(".npy"):
        print(f"{prog}: --out {args.out}: an encode writes its latent as .npy", file=sys.stderr)
        return 2
    request.posterior = POSTERIORS[args.posterior]
    request.mode = MODES[args.mode]
    request.latent_space = pb2.LATENT_SPACE_RAW if args.latent_space == "raw" else pb2.LATENT_SPACE_VAE
    request.request_id = args.request_id
    if args.seed is not None:
        request.seed = args.seed
    try:
        result = encode(stub, request, args.deadline_s)
        np.save(args.out, result.array)
    except grpc.RpcError as e:
        print(f"{prog}: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    except StreamError as e:
        print(f"{prog}: bad stream from the server: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    h, t = result.header, result.trailer.timings
    seed = f" sample_seed={h.sample_seed}" if h.HasField("sample_seed") else ""
    print(f"request_id={h.request_id} shape=[{','.join(map(str, h.shape))}] mode={pb2.Mode.Name(h.mode)} "
          f"degree={h.degree} queue_ms={t.queue_ms:.1f} encode_ms={t.decode_ms:.1f} total_ms={t.total_ms:.1f} "
          f"client_ms={result.total_s * 1e3:.1f} wrote={args.out}{seed}")
    return 0


def main(argv=None):
    args = parse_args(argv)
    prog = os.path.basename(sys.argv[0])
    stub = pb2_grpc.VaeDecoderStub(channel(args.server, args.tls_ca, args.tls_cert, args.tls_key))
    try:
        if args.list_models:
            for m in stub.ListModels(pb2.ListModelsRequest(), timeout=args.deadline_s).models:
                print(f"{m.name} family={m.family} latent_channels={m.latent_channels} "
                      f"spatial_factor={m.spatial_factor} video={'yes' if m.is_video else 'no'}")
            return 0
        if args.image:
            return run_encode(stub, args, prog)
        try:
            if args.latent:
                latent = np.load(args.latent)
            else:
                latent = demo_latent([int(d) for d in args.latent_shape.split(",")], args.seed or 0)
            tensor = latent_tensor(latent)
        except (OSError, ValueError) as e:
            print(f"{prog}: {e}", file=sys.stderr)
            return 2
        if args.save_latent:
            np.save(args.save_latent, wire_array(latent))  # exactly what is sent
        fmt = args.format or ("png" if args.out.endswith(".png") else "float32")
        request = pb2.DecodeRequest(
            model=args.model, latent=tensor, mode=MODES[args.mode], output_format=FORMATS[fmt],
            latent_space=pb2.LATENT_SPACE_RAW if args.latent_space == "raw" else pb2.LATENT_SPACE_VAE,
            request_id=args.request_id)
        if args.stream_chunks:
            def report(t):
                state = ",".join(map(str, t.state_bytes_per_rank))
                print(f"chunk={t.chunk} first_frame={t.first_frame} frames={t.frames} queue_ms={t.timings.queue_ms:.1f} "
                      f"decode_ms={t.timings.decode_ms:.1f} stream_ms={t.timings.stream_ms:.1f} state_bytes=[{state}]"
                      + (f" replayed={t.replayed_latent_frames}" if t.replayed_latent_frames else ""))
            chunks = [int(n) for n in args.stream_chunks.split(",")]
            result = decode_session(stub, request, chunks, args.deadline_s, report)
        else:
            result = decode(stub, request, args.deadline_s)
        written = write_output(args.out, result)
    except grpc.RpcError as e:
        print(f"{prog}: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    except StreamError as e:
        print(f"{prog}: bad stream from the server: {e}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    h, t = result.header, result.trailer.timings
    print(f"request_id={h.request_id} shape=[{','.join(map(str, h.shape))}] mode={pb2.Mode.Name(h.mode)} "
          f"degree={h.degree} reason=\"{h.mode_reason}\" chunks={result.chunks} "
          f"first_chunk_ms={(result.first_chunk_s or 0) * 1e3:.1f} queue_ms={t.queue_ms:.1f} "
          f"decode_ms={t.decode_ms:.1f} gather_ms={t.gather_ms:.1f} stream_ms={t.stream_ms:.1f} "
          f"total_ms={t.total_ms:.1f} client_ms={result.total_s * 1e3:.1f} wrote={','.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
