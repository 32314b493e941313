"""Writes the seed corpora of the protocol fuzzers (server/*_fuzzer.cc):

  remote_decode_corpus/  model byte, request target, '\\n', body
  oip_infer_corpus/      model byte, serialized inference.ModelInferRequest
  oip_rest_corpus/       model byte, Inference-Header-Content-Length as 4
                         little-endian bytes (0xffffffff: absent), POST body
  session_request_corpus/ model byte, group-size byte, the open's length as 2
                         little-endian bytes, a SessionRequest (open), a
                         SessionRequest (chunk); with vaedecode's own stubs
                         (bazel build //client/python:stubs; found under
                         bazel-bin/client/python)

Run with the pinned venv (tools/python_env.sh: numpy, tritonclient's
generated protobuf classes, whose field numbers are the protocol's):

  $(tools/python_env.sh) server/testdata/make_protocol_corpus.py

Model bytes index server/fuzz_models.cc: 0 image (FLUX.1-like, 16 ch),
1 flux2 (packed raw, 128 raw ch), 2 video (Wan-like), 3 ltx (timestep
conditioned), 4 windows (MiniMax-H3 frame table), 5 half (float16, 4 ch),
6 rgba (4 output channels), 7 audio (LTX-2's audio VAE and vocoder:
[B, 8, L, 16] or packed raw [B, L, 128] to a 24 kHz stereo waveform). Crashes the fuzzers find are added by hand as
crash-<what> files, so every test run replays them.
"""

import json
import pathlib
import struct
import sys
import zlib

import numpy as np
from tritonclient.grpc import service_pb2

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1] / "bazel-bin" / "client" / "python"))
from vaedecode.v1 import vaedecode_pb2 as v1  # noqa: E402
IMAGE, FLUX2, VIDEO, LTX, WINDOWS, HALF, RGBA, AUDIO = range(8)


def query(shape, **params):
    pieces = [f"shape={d}" for d in shape] + [f"{k}={v}" for k, v in params.items()]
    return "/models/m?" + "&".join(pieces)


def floats(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype).tobytes()


def remote_decode_seeds():
    yield "image_pt", IMAGE, query([1, 16, 2, 2], dtype="float32", output_type="pt"), floats((1, 16, 2, 2))
    yield "image_pil_scaling", IMAGE, query([1, 16, 2, 3], dtype="float32", scaling_factor=0.3611,
                                            shift_factor=0.1159, image_format="png"), floats((1, 16, 2, 3))
    yield "image_half_partial", IMAGE, query([1, 16, 2, 2], dtype="float16", output_type="pt",
                                             partial_postprocess="True", do_scaling="True"), \
        floats((1, 16, 2, 2), np.float16)
    yield "image_bf16_mode", IMAGE, query([2, 16, 1, 2], dtype="bfloat16", output_type="pt", mode="exact",
                                          output_dtype="float16"), b"\x3f\x80" * 64
    yield "flux1_packed", IMAGE, query([1, 4, 64], dtype="float32", height=32, width=32, output_type="pt"), \
        floats((1, 4, 64))
    yield "flux2_packed", FLUX2, query([1, 2, 128], dtype="float32", height=16, width=32, output_type="pt"), \
        floats((1, 2, 128))
    yield "flux2_packed_vae", FLUX2, query([1, 1, 128], dtype="float32", height=16, width=16, do_scaling="False",
                                           output_type="pt"), floats((1, 1, 128))
    yield "video_mp4", VIDEO, query([1, 16, 2, 2, 2], dtype="float32", output_type="mp4", fps=24), \
        floats((1, 16, 2, 2, 2))
    yield "video_pil", VIDEO, query([1, 16, 3, 1, 2], dtype="float32", do_scaling="False"), floats((1, 16, 3, 1, 2))
    yield "ltx_noise", LTX, query([1, 128, 2, 1, 1], dtype="float32", output_type="pt", decode_timestep=0.05,
                                  decode_noise_scale=0.025, noise_seed=7), floats((1, 128, 2, 1, 1))
    yield "windows_frames", WINDOWS, query([1, 16, 5, 1, 1], dtype="float32", output_type="pt"), \
        floats((1, 16, 5, 1, 1))
    yield "half_overflow", HALF, query([1, 4, 1, 2], dtype="float32", output_type="pt"), \
        np.array([7e4, 1, float("nan"), 2], np.float32).tobytes() * 1
    yield "rgba_jpeg", RGBA, query([1, 16, 1, 1], dtype="float32", image_format="jpg", jpeg_quality=90), \
        floats((1, 16, 1, 1))
    # The SIGSEGV: 2^62 x 1 x 4 float32 elements wrap to 0 bytes.
    yield "crash-packed_shape_overflow", IMAGE, \
        "/models/flux1?shape=4611686018427387904&shape=1&shape=4&dtype=float32&height=16&width=16", b""
    yield "packed_tokens_overflow", IMAGE, query([1, 4, 4], dtype="float32", height=2**62, width=2**62), b""
    yield "percent_encoded", IMAGE, "/?shape=1&shape=16&shape=1&shape=1&dtype=float32&scaling%5Ffactor=%2B1e0&" \
        "output_type=pt&x=%zz%", floats((1, 16, 1, 1))
    yield "bad_values", IMAGE, query([1, -16, 0], dtype="int8", fps=999, jpeg_quality=0, mode="fast"), b"\x00" * 3
    # remote_encode: the same fuzzer reads every input as an encode too.
    yield "audio_pt", AUDIO, query([1, 8, 3, 16], dtype="float32", output_type="pt", do_scaling="False"), \
        floats((1, 8, 3, 16))
    yield "audio_packed_raw_wav", AUDIO, query([1, 3, 128], dtype="float32", latent_space="raw",
                                               wav_encoding="float32"), floats((1, 3, 128))
    yield "audio_mel_wav", AUDIO, query([2, 8, 1, 16], dtype="bfloat16", output_type="wav", audio_output="mel",
                                        partial_postprocess="True"), floats((2, 8, 1, 16), np.float16)
    yield "video_mp4_audio", VIDEO, query([1, 16, 2, 1, 2], dtype="float32", output_type="mp4", audio_model="audio") \
        + "&audio_shape=1&audio_shape=8&audio_shape=3&audio_shape=16&audio_latent_space=raw", \
        floats((1, 16, 2, 1, 2)) + floats((1, 8, 3, 16), seed=1)
    yield "encode_png", IMAGE, "/encode?scaling_factor=0.18215&posterior=sample&seed=7", png(16, 16)
    yield "encode_tensor", IMAGE, query([1, 3, 16, 16], dtype="float32", mode="exact"), floats((1, 3, 16, 16))
    yield "encode_uint8_video", VIDEO, query([1, 5, 16, 16, 3], dtype="uint8", latent_space="raw"), \
        bytes(5 * 16 * 16 * 3)
    yield "encode_contradiction", IMAGE, "/encode?latent_space=raw&shift_factor=0.1&posterior=moments", png(8, 8)


def png(width, height):
    """A small RGB PNG (zlib-compressed rows of filter 0)."""
    rows = b"".join(b"\x00" + bytes((x * 7 + y * 3) % 256 for x in range(width * 3)) for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def infer_request(datatype, shape, raw=None, fp32=None, name="latent", output="sample", **parameters):
    r = service_pb2.ModelInferRequest(model_name="m", id="fuzz-seed")
    t = r.inputs.add(name=name, datatype=datatype, shape=list(shape))
    if fp32 is not None:
        t.contents.fp32_contents.extend(fp32)
    if raw is not None:
        r.raw_input_contents.append(raw)
    r.outputs.add(name=output)
    for k, v in parameters.items():
        p = r.parameters[k]
        if isinstance(v, bool):
            p.bool_param = v
        elif isinstance(v, int):
            p.int64_param = v
        elif isinstance(v, float):
            p.double_param = v
        else:
            p.string_param = v
    return r


def oip_seeds():
    yield "image_raw", IMAGE, infer_request("FP32", (1, 16, 2, 2), raw=floats((1, 16, 2, 2)))
    yield "image_fp32_contents", IMAGE, infer_request("FP32", (1, 16, 1, 1), fp32=[0.5] * 16,
                                                      latent_space="raw", scaling_factor=0.5, shift_factor=0.1)
    yield "image_fp16_uint8", IMAGE, infer_request("FP16", (1, 16, 1, 2), raw=floats((1, 16, 1, 2), np.float16),
                                                   output_format="uint8", mode="dense")
    yield "image_bf16_png", IMAGE, infer_request("BF16", (1, 16, 1, 1), raw=b"\x3f\x80" * 16, output_format="png",
                                                 jpeg_quality=80, priority=1, timeout=100)
    yield "flux2_raw", FLUX2, infer_request("FP32", (1, 128, 1, 1), raw=floats((1, 128, 1, 1)), latent_space="raw")
    yield "video_mp4", VIDEO, infer_request("FP32", (1, 16, 2, 1, 1), raw=floats((1, 16, 2, 1, 1)),
                                            output_format="mp4", fps=30)
    yield "ltx_seed", LTX, infer_request("FP32", (1, 128, 1, 1, 1), raw=floats((1, 128, 1, 1, 1)),
                                         decode_timestep=0.05, noise_seed=3)
    yield "windows_float16", WINDOWS, infer_request("FP32", (1, 16, 4, 1, 1), raw=floats((1, 16, 4, 1, 1)),
                                                    output_format="float16")
    both = infer_request("FP32", (1, 16, 1, 1), raw=floats((1, 16, 1, 1)), fp32=[1.0] * 16)
    yield "audio_wav", AUDIO, infer_request("FP32", (2, 8, 2, 16), raw=floats((2, 8, 2, 16)), output_format="wav",
                                            audio_output="waveform")
    yield "audio_mel_png", AUDIO, infer_request("FP16", (1, 3, 128), raw=floats((1, 3, 128), np.float16),
                                                output_format="png", audio_output="mel", latent_space="raw")
    two = infer_request("FP32", (1, 16, 2, 1, 1), raw=floats((1, 16, 2, 1, 1)), output_format="mp4",
                        audio_model="audio")
    two.inputs.add(name="audio_latent", datatype="FP32", shape=[1, 8, 2, 16])
    two.raw_input_contents.append(floats((1, 8, 2, 16), seed=2))
    yield "video_mp4_audio", VIDEO, two
    yield "raw_and_typed", IMAGE, both
    classified = infer_request("FP32", (1, 16, 1, 1), raw=floats((1, 16, 1, 1)))
    classified.outputs[0].parameters["classification"].int64_param = 3
    yield "output_classification", IMAGE, classified
    huge = infer_request("FP32", (2**62, 1, 4, 1), raw=b"")
    yield "shape_overflow", IMAGE, huge
    yield "bad_parameters", HALF, infer_request("FP64", (1, 4, 1, 1), raw=b"\x00" * 32, colour="red",
                                                mode=3, fps=0.5)
    yield "encode_fp32", IMAGE, infer_request("FP32", (1, 3, 8, 8), raw=floats((1, 3, 8, 8)), name="image",
                                              output="latent", operation="encode", posterior="sample", seed=7)
    file = png(8, 8)
    yield "encode_png_bytes", VIDEO, infer_request("BYTES", (1,), raw=struct.pack("<I", len(file)) + file,
                                                   name="image", output="latent", operation="encode")


def rest_body(inputs, outputs=None, binary=b"", **parameters):
    header = {"id": "fuzz-seed", "inputs": inputs}
    if outputs is not None:
        header["outputs"] = outputs
    if parameters:
        header["parameters"] = parameters
    text = json.dumps(header).encode()
    return (len(text) if binary else None), text + binary


def oip_rest_seeds():
    raw = floats((1, 16, 2, 2))
    yield "binary_in_out", IMAGE, *rest_body(
        [{"name": "latent", "shape": [1, 16, 2, 2], "datatype": "FP32", "parameters": {"binary_data_size": len(raw)}}],
        [{"name": "sample", "parameters": {"binary_data": True}}], raw)
    yield "json_nested", IMAGE, *rest_body(
        [{"name": "latent", "shape": [1, 16, 1, 1], "datatype": "FP32", "data": [[[[0.5]] * 1] * 16]}],
        output_format="uint8", latent_space="raw", scaling_factor=0.5)
    half = floats((1, 16, 1, 2), np.float16)
    yield "fp16_png_binary_output", IMAGE, *rest_body(
        [{"name": "latent", "shape": [1, 16, 1, 2], "datatype": "FP16", "parameters": {"binary_data_size": len(half)}}],
        None, half, binary_data_output=True, output_format="png")
    video = floats((1, 16, 2, 1, 1))
    yield "video_mp4", VIDEO, *rest_body(
        [{"name": "latent", "shape": [1, 16, 2, 1, 1], "datatype": "FP32", "parameters": {"binary_data_size": len(video)}}],
        [{"name": "sample"}], video, output_format="mp4", fps=12, binary_data_output=True)
    yield "ltx_noise", LTX, *rest_body(
        [{"name": "latent", "shape": [1, 128, 1, 1, 1], "datatype": "FP32", "data": [0.1] * 128}],
        decode_timestep=0.05, noise_seed=18446744073709551615)
    yield "classification", IMAGE, *rest_body(
        [{"name": "latent", "shape": [1, 16, 1, 1], "datatype": "FP32", "data": [1.0] * 16}],
        [{"name": "sample", "parameters": {"classification": 3}}])
    yield "bad_sizes", IMAGE, 10, b'{"inputs":[{"name":"latent","shape":[4611686018427387904,1],"datatype":"FP32",' \
        b'"parameters":{"binary_data_size":-1}}]}'
    yield "not_json", HALF, None, b'{"inputs": [{"name": "latent", "shape": [1, "4"], "data": [[[[[[[[[[1]]]]]]]]]]'


def session_request(model, group, open_fields, chunk_shape, dtype=None, data=None, last=False):
    open_message = v1.SessionRequest(open=v1.SessionOpen(**open_fields)).SerializeToString()
    dtype = dtype if dtype is not None else open_fields.get("latent_dtype", v1.FLOAT32)
    if data is None:
        data = floats(chunk_shape, np.float16 if dtype == v1.FLOAT16 else np.float32)
    tensor = v1.Tensor(dtype=dtype, shape=list(chunk_shape), data=data)
    chunk = (v1.SessionRequest(last_chunk=tensor) if last else v1.SessionRequest(chunk=tensor)).SerializeToString()
    return bytes([model, group]) + struct.pack("<H", len(open_message)) + open_message + chunk


def session_request_seeds():
    base = dict(model="m", latent_dtype=v1.FLOAT32, shape=[1, 16, 2, 3], output_format=v1.OUTPUT_FLOAT32)
    yield "dense", session_request(VIDEO, 0, dict(base, mode=v1.MODE_DENSE), (1, 16, 2, 2, 3))
    yield "auto_exact_png", session_request(VIDEO, 1, dict(base, output_format=v1.OUTPUT_PNG, png_compression=1),
                                            (1, 16, 1, 2, 3))
    yield "raw_scaling", session_request(VIDEO, 3, dict(base, latent_space=v1.LATENT_SPACE_RAW, scaling_factor=0.5,
                                                        shift_factor=0.1, idle_timeout_ms=500), (1, 16, 3, 2, 3))
    yield "half_batch", session_request(VIDEO, 1, dict(base, latent_dtype=v1.FLOAT16, shape=[2, 16, 1, 2],
                                                       mode=v1.MODE_EXACT), (2, 16, 1, 1, 2))
    yield "wrong_chunk", session_request(VIDEO, 0, base, (1, 16, 1, 3, 2))
    yield "short_data", session_request(VIDEO, 0, base, (1, 16, 1, 2, 3), data=b"\0" * 12)
    yield "mp4_refused", session_request(VIDEO, 0, dict(base, output_format=v1.OUTPUT_MP4), (1, 16, 1, 2, 3))
    yield "audio_refused", session_request(AUDIO, 0, dict(base, shape=[1, 8, 16]), (1, 8, 2, 16))
    yield "not_streaming", session_request(LTX, 0, dict(base, shape=[1, 128, 1, 1]), (1, 128, 1, 1, 1))
    yield "image_model", session_request(IMAGE, 0, base, (1, 16, 1, 2, 3))
    yield "windows_last_chunk", session_request(WINDOWS, 1, dict(base, mode=v1.MODE_EXACT), (1, 16, 1, 2, 3),
                                                last=True)


def main():
    for name, corpus in (("remote_decode_corpus", remote_decode_seeds()), ("oip_infer_corpus", oip_seeds()),
                         ("oip_rest_corpus", oip_rest_seeds()), ("session_request_corpus", session_request_seeds())):
        folder = HERE / name
        folder.mkdir(exist_ok=True)
        for seed in corpus:
            if name == "remote_decode_corpus":
                label, model, target, body = seed
                data = bytes([model]) + target.encode() + b"\n" + body
            elif name == "session_request_corpus":
                label, data = seed
            elif name == "oip_infer_corpus":
                label, model, request = seed
                data = bytes([model]) + request.SerializeToString()
            else:
                label, model, length, body = seed
                data = bytes([model]) + struct.pack("<I", 0xFFFFFFFF if length is None else length) + body
            (folder / label).write_bytes(data)
        print(f"{folder}: {len(list(folder.iterdir()))} seeds")


if __name__ == "__main__":
    main()
