"""tritonclient.grpc (unmodified, from PyPI) against a real vaedecode_server:
the Open Inference Protocol on the vaedecode.v1 port, compared with the
gRPC Decode path (the C++ vaedecode_client) and diffusers' fixture decodes:

  - liveness, readiness (server and per model), server and model metadata;
  - infer on an image and a video model: FP32 "sample" equal to
    vaedecode.v1.Decode's (1e-6) and to diffusers' (1e-4), raw latents with
    the request's scaling_factor / shift_factor or the model's formula;
  - FP16 input with uint8 output, PNG / JPEG outputs as BYTES equal to the
    files vaedecode.v1.Decode makes;
  - errors name the problem (input, parameter, model, version), an output
    over the message limit is RESOURCE_EXHAUSTED naming the streaming
    Decode before any group decodes it, and the server keeps serving;
    /metrics counts protocol="oip";
  - what the protocol calls errors are errors (raw and typed contents at
    once, output parameters not honoured), an unknown model is not ready
    rather than an error, and methods not served say what is;
  - ModelConfig (every datatype served), the repository index and
    statistics that count the decodes made;
  - encode (operation "encode"): FP32 image -> "latent" within 1e-4 of
    diffusers, a seeded sample, a PNG as BYTES, bad operations named.
"""

import json
import sys
import types

import io

import av
import numpy as np
import safetensors.numpy
import grpc
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from PIL import Image

from protocol_harness import TMP, Checks, Server, expect_oip_error as expect_error, fixture

FLUX_SCALE, FLUX_SHIFT = 0.3611, 0.1159


def load(path):
    tensors = safetensors.numpy.load_file(str(path))
    return next(iter(tensors.values())) if len(tensors) == 1 else tensors["latent"]


def infer(client, model, latent, datatype="FP32", **parameters):
    latent_input = grpcclient.InferInput("latent", list(latent.shape), datatype)
    latent_input.set_data_from_numpy(latent)
    result = client.infer(model, [latent_input], outputs=[grpcclient.InferRequestedOutput("sample")],
                          parameters=parameters or None)
    return result.as_numpy("sample")


def main():
    # A 2 MiB message limit (256 KiB chunks) so a modest output overflows it.
    server = Server({"flux1": "flux1_kl", "wan": "wan21", "qwen21": "qwenimage21", "hunyuan3": "hunyuanimage3"},
                    extra_flags=["--max_message_bytes=2097152", "--chunk_bytes=262144"])
    client = grpcclient.InferenceServerClient(url=server.grpc)
    checks = Checks("oip")
    pipeline_latent = load(fixture("flux1_kl", "pipeline_latent.safetensors"))
    expected = load(fixture("flux1_kl", "expected.safetensors"))

    def queue_count():
        """Jobs a group has taken (vaedecode_queue_seconds counts each once)."""
        return sum(float(line.rsplit(" ", 1)[1]) for line in server.scrape().splitlines()
                   if line.startswith("vaedecode_queue_seconds_count"))

    def grpc_decode(model, latent_path, out_name, *flags):
        out = TMP / out_name
        server.client(f"--model={model}", f"--latent={latent_path}", f"--out={out}", *flags)
        return out

    def health_and_metadata():
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("flux1") and client.is_model_ready("wan")
        assert client.is_model_ready("wan", "1")
        # Triton answers "not ready" for a model it does not have: readiness loops poll, they do not crash.
        assert client.is_model_ready("nope") is False and client.is_model_ready("flux1", "7") is False
        meta = client.get_server_metadata()
        assert meta.name == "vaedecode", meta
        model = client.get_model_metadata("flux1")
        assert model.platform == "vaedecode_autoencoder_kl", model.platform
        assert [(t.name, t.datatype, list(t.shape)) for t in model.inputs] == [("latent", "FP32", [-1, 16, -1, -1])]
        assert [(t.name, list(t.shape)) for t in model.outputs] == [("sample", [-1, 3, -1, -1])]
        video = client.get_model_metadata("wan")
        assert list(video.inputs[0].shape) == [-1, 16, -1, -1, -1], video.inputs[0].shape

    def image_infer_matches_grpc_and_diffusers():
        out = infer(client, "flux1", pipeline_latent, latent_space="raw", scaling_factor=FLUX_SCALE,
                    shift_factor=FLUX_SHIFT)
        assert out.dtype == np.float32 and out.shape == (1, 3, 136, 184), (out.dtype, out.shape)
        assert np.abs(out - expected).max() <= 1e-4
        ref = np.load(grpc_decode("flux1", fixture("flux1_kl", "pipeline_latent.safetensors"), "flux.npy",
                                  "--latent_space=raw"))
        assert np.abs(out - ref).max() <= 1e-6
        # The model's own raw formula gives the same.
        same = infer(client, "flux1", pipeline_latent, latent_space="raw")
        assert np.abs(same - expected).max() <= 1e-4

    def video_infer_matches_grpc_and_diffusers():
        latent = load(fixture("wan21", "latent.safetensors"))
        out = infer(client, "wan", latent, mode="exact")
        ref = load(fixture("wan21", "expected.safetensors"))
        assert out.shape == ref.shape == (1, 3, 13, 56, 40), out.shape
        assert np.abs(out - ref).max() <= 1e-4
        grpc_out = np.load(grpc_decode("wan", fixture("wan21", "latent.safetensors"), "wan.npy", "--mode=exact"))
        assert np.abs(out - grpc_out).max() <= 1e-6

    def rgba_image_model_in_every_mode():
        # Qwen-Image-2.1: RGBA, 16x, its pipeline's latents * std + mean for raw.
        raw = load(fixture("qwenimage21", "pipeline_latent.safetensors"))
        ref = load(fixture("qwenimage21", "expected.safetensors"))
        for mode in ("dense", "exact", "tiled"):
            out = infer(client, "qwen21", raw, latent_space="raw", mode=mode)
            assert out.shape == ref.shape == (1, 4, 1, 112, 64), (mode, out.shape)
            assert np.abs(out - ref).max() <= 1e-4, (mode, np.abs(out - ref).max())
        png = infer(client, "qwen21", raw, latent_space="raw", output_format="png")
        assert png.dtype == np.object_ and png.size == 1, (png.dtype, png.shape)
        image = Image.open(io.BytesIO(png.reshape(-1)[0]))
        assert image.mode == "RGBA" and image.size == (64, 112), (image.mode, image.size)

    def release_code_model_in_every_mode():
        # Hunyuan Image 3 (its release's AutoencoderKLConv3D): the pipeline's [B, C, h, w]
        # latents; the release's vae.decode output without its one-frame axis.
        raw = load(fixture("hunyuanimage3", "pipeline_latent.safetensors"))
        ref = load(fixture("hunyuanimage3", "expected.safetensors"))[:, :, 0]
        for mode in ("dense", "exact", "tiled"):
            out = infer(client, "hunyuan3", raw, latent_space="raw", mode=mode)
            assert out.shape == ref.shape == (1, 3, 28, 20), (mode, out.shape)
            assert np.abs(out - ref).max() <= 1e-4, (mode, np.abs(out - ref).max())

    def fp16_input_uint8_output():
        latent = load(fixture("flux1_kl", "latent.safetensors"))
        out = infer(client, "flux1", latent.astype(np.float16), "FP16", output_format="uint8")
        assert out.dtype == np.uint8 and out.shape == (1, 136, 184, 3), (out.dtype, out.shape)
        f16 = TMP / "latent_f16.safetensors"
        safetensors.numpy.save_file({"latent": latent.astype(np.float16)}, str(f16))
        ref = np.load(grpc_decode("flux1", f16, "flux_u8.npy", "--output_format=uint8"))
        assert np.array_equal(out, ref)

    def png_and_jpeg_outputs_are_the_grpc_files():
        latent_path = fixture("flux1_kl", "latent.safetensors")
        latent = load(latent_path)
        for fmt, ext in (("png", "png"), ("jpeg", "jpg")):
            out = infer(client, "flux1", latent, output_format=fmt, jpeg_quality=90)
            assert out.dtype == np.object_ and out.shape == (1,), (out.dtype, out.shape)
            ref = grpc_decode("flux1", latent_path, f"flux.{ext}", "--jpeg_quality=90")
            assert out[0] == ref.read_bytes(), fmt
        video = infer(client, "wan", load(fixture("wan21", "latent.safetensors")), output_format="png")
        assert video.shape == (13,) and all(v.startswith(b"\x89PNG") for v in video), video.shape
        mp4 = infer(client, "wan", load(fixture("wan21", "latent.safetensors")), output_format="mp4", fps=8)
        assert mp4.shape == (1,) and mp4[0][4:8] == b"ftyp", mp4.shape
        with av.open(io.BytesIO(mp4[0])) as container:
            stream = container.streams.video[0]
            assert float(stream.average_rate) == 8 and (stream.width, stream.height) == (40, 56)
            assert sum(1 for _ in container.decode(stream)) == 13

    def bad_requests_name_the_problem():
        latent = load(fixture("flux1_kl", "latent.safetensors"))
        wrong_name = grpcclient.InferInput("z", list(latent.shape), "FP32")
        wrong_name.set_data_from_numpy(latent)
        expect_error(lambda: client.infer("flux1", [wrong_name]), "INVALID_ARGUMENT", "expected one input \"latent\"")
        expect_error(lambda: infer(client, "flux1", latent, colour="red"), "parameter \"colour\": unknown")
        expect_error(lambda: infer(client, "flux1", latent, output_format="gif"), "use float32, float16, uint8")
        expect_error(lambda: infer(client, "flux1", latent, output_format="mp4"), "mp4 holds video")
        expect_error(lambda: infer(client, "flux1", latent[:, :4]), "takes 16 latent channels, got 4")
        expect_error(lambda: infer(client, "nope", latent), "NOT_FOUND", "flux1")
        versioned = grpcclient.InferInput("latent", list(latent.shape), "FP32")
        versioned.set_data_from_numpy(latent)
        expect_error(lambda: client.infer("flux1", [versioned], model_version="7"), "version 1 only")
        wrong_output = grpcclient.InferRequestedOutput("image")
        expect_error(lambda: client.infer("flux1", [versioned], outputs=[wrong_output]), "\"image\" is not an output")
        big = np.random.default_rng(0).standard_normal((1, 16, 64, 64), dtype=np.float32)
        taken = queue_count()
        expect_error(lambda: infer(client, "flux1", big), "RESOURCE_EXHAUSTED", "vaedecode.v1.Decode (streaming)",
                     "the output is 3.0 MiB")
        assert queue_count() == taken, "a group decoded a request whose reply was known to be too large"
        # And the server still serves.
        assert np.abs(infer(client, "flux1", latent) - expected).max() <= 1e-4

    def raw_and_typed_contents_together_are_refused():
        latent = load(fixture("flux1_kl", "latent.safetensors"))
        # Raw and typed contents at once: the protocol says error.
        stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc))
        both = service_pb2.ModelInferRequest(model_name="flux1")
        tensor = both.inputs.add(name="latent", datatype="FP32", shape=list(latent.shape))
        tensor.contents.fp32_contents.extend(latent.ravel().tolist())
        both.raw_input_contents.append(latent.tobytes())
        try:
            stub.ModelInfer(both)
            raise AssertionError("raw and typed contents together were accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "both raw_input_contents" in e.details(), e

    def output_parameters_not_honoured_are_refused():
        latent = load(fixture("flux1_kl", "latent.safetensors"))
        ranked = grpcclient.InferInput("latent", list(latent.shape), "FP32")
        ranked.set_data_from_numpy(latent)
        expect_error(lambda: client.infer("flux1", [ranked], outputs=[grpcclient.InferRequestedOutput("sample", class_count=3)]),
                     "INVALID_ARGUMENT", "\"classification\" is not supported")

    def config_index_and_statistics():
        config = client.get_model_config("wan").config
        assert config.max_batch_size == 0 and list(config.input[0].dims) == [-1, 16, -1, -1, -1], config
        assert config.parameters["latent_datatypes"].string_value == "FP32,FP16,BF16"
        assert "BYTES" in config.parameters["sample_datatypes"].string_value
        index = client.get_model_repository_index()
        assert sorted((m.name, m.state) for m in index.models) == [("flux1", "READY"), ("hunyuan3", "READY"),
                                                                    ("qwen21", "READY"), ("wan", "READY")], index
        stats = {s.name: s for s in client.get_inference_statistics().model_stats}
        assert stats["flux1"].execution_count >= 4 and stats["wan"].execution_count >= 2, stats
        assert stats["flux1"].inference_stats.compute_infer.ns > 0 and stats["flux1"].last_inference > 0
        expect_error(lambda: client.get_model_config("nope"), "NOT_FOUND", "flux1")

    def unserved_methods_say_what_is_served():
        expect_error(lambda: client.load_model("flux1"), "UNIMPLEMENTED", "RepositoryModelLoad", "ModelInfer")
        expect_error(lambda: client.get_system_shared_memory_status(), "UNIMPLEMENTED", "SystemSharedMemoryStatus")

    def encode_with_the_operation_parameter():
        # operation "encode": input "image" [B, C, H, W] in [-1, 1], output "latent".
        image = safetensors.numpy.load_file(str(fixture("flux1_kl", "image.safetensors")))["image"]
        mean = safetensors.numpy.load_file(str(fixture("flux1_kl", "posterior_mean.safetensors")))["mean"]
        image_input = grpcclient.InferInput("image", list(image.shape), "FP32")
        image_input.set_data_from_numpy(image)
        result = client.infer("flux1", [image_input], outputs=[grpcclient.InferRequestedOutput("latent")],
                              parameters={"operation": "encode", "mode": "exact"})
        out = result.as_numpy("latent")
        assert out.shape == mean.shape and np.abs(out - mean).max() <= 1e-4, (out.shape, np.abs(out - mean).max())
        # A seeded sample, diffusers' draw; the seed comes back.
        sample = safetensors.numpy.load_file(str(fixture("flux1_kl", "posterior_sample.safetensors")))["sample"]
        seed = next(c for c in json.loads(fixture("flux1_kl", "meta.json").read_text())["encode_cases"]
                    if c["case"] == "main")["sample_seed"]
        result = client.infer("flux1", [image_input], outputs=[grpcclient.InferRequestedOutput("latent")],
                              parameters={"operation": "encode", "posterior": "sample", "seed": seed})
        assert np.abs(result.as_numpy("latent") - sample).max() <= 1e-4
        assert result.get_response().parameters["sample_seed"].uint64_param == seed
        # A PNG as one BYTES element; a still image is one frame of the video model.
        png = io.BytesIO()
        Image.fromarray(np.full((48, 32, 3), 200, dtype=np.uint8)).save(png, format="PNG")
        file_input = grpcclient.InferInput("image", [1], "BYTES")
        file_input.set_data_from_numpy(np.array([png.getvalue()], dtype=np.object_))
        result = client.infer("wan", [file_input], parameters={"operation": "encode"})
        assert result.as_numpy("latent").shape == (1, 16, 1, 6, 4), result.as_numpy("latent").shape
        expect_error(lambda: client.infer("flux1", [image_input], parameters={"operation": "paint"}),
                     "INVALID_ARGUMENT", "operation", "encode")
        expect_error(lambda: client.infer("flux1", [image_input], parameters={"operation": "encode", "fps": 3}),
                     "INVALID_ARGUMENT", "fps", "posterior")

    def metrics_count_oip_calls():
        text = server.scrape()
        oip = [line for line in text.splitlines()
               if line.startswith("vaedecode_requests_total{") and 'protocol="oip"' in line]
        ok = sum(float(line.rsplit(" ", 1)[1]) for line in oip if 'status="OK"' in line)
        refused = sum(float(line.rsplit(" ", 1)[1]) for line in oip if 'status="INVALID_ARGUMENT"' in line)
        assert ok >= 8 and refused >= 4, (ok, refused)

    for name, fn in list(locals().items()):  # the checks above, in order
        if isinstance(fn, types.FunctionType) and not name.startswith(("grpc_decode", "queue_count", "main")) and fn.__code__.co_argcount == 0:
            checks.run(name, fn)
    client.close()
    server.stop()
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
