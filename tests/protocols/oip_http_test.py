"""tritonclient.http (unmodified, from PyPI) against a real vaedecode_server:
the Open Inference Protocol's HTTP/REST binding on --http_listen, compared
with the gRPC Decode path (the C++ vaedecode_client) and diffusers' fixture
decodes:

  - liveness, readiness (server and per model; an unknown model is not
    ready), server and model metadata, ModelConfig (tensors and every
    datatype served), the repository index, and statistics that count the
    decodes made;
  - infer on an image and a video model, with Triton's binary tensors: FP32
    "sample" equal to vaedecode.v1.Decode's (1e-6) and to diffusers' (1e-4);
    JSON tensors both ways; FP16 in with uint8 out; PNG as BYTES equal to
    the file vaedecode.v1.Decode makes;
  - errors name the problem (input, parameter, model, version), an output
    over --max_call_output_mib is refused before any group decodes it, the
    calls Triton has and vaedecode does not answer 501 saying what is served,
    and the server keeps serving; /metrics and the request log count the
    calls as protocol="oip_http".
"""

import sys
import types

import numpy as np
import requests
import safetensors.numpy
import tritonclient.http as httpclient

from protocol_harness import TMP, Checks, Server, expect_oip_error as expect_error, fixture

FLUX_SCALE, FLUX_SHIFT = 0.3611, 0.1159


def load(path):
    tensors = safetensors.numpy.load_file(str(path))
    return next(iter(tensors.values())) if len(tensors) == 1 else tensors["latent"]


def infer(client, model, latent, datatype="FP32", binary=True, **parameters):
    latent_input = httpclient.InferInput("latent", list(latent.shape), datatype)
    latent_input.set_data_from_numpy(latent, binary_data=binary)
    result = client.infer(model, [latent_input], outputs=[httpclient.InferRequestedOutput("sample", binary_data=binary)],
                          parameters=parameters or None)
    return result.as_numpy("sample")


def main():
    # A 1 MiB limit on one reply, so a modest output overflows it.
    server = Server({"flux1": "flux1_kl", "wan": "wan21"},
                    extra_flags=["--max_call_output_mib=1", "--chunk_bytes=262144"])
    client = httpclient.InferenceServerClient(url=server.http.removeprefix("http://"))
    checks = Checks("oip_http")
    pipeline_latent = load(fixture("flux1_kl", "pipeline_latent.safetensors"))
    expected = load(fixture("flux1_kl", "expected.safetensors"))
    decodes = {"flux1": 0, "wan": 0}

    def grpc_decode(model, latent_path, out_name, *flags):
        out = TMP / out_name
        server.client(f"--model={model}", f"--latent={latent_path}", f"--out={out}", *flags)
        return out

    def counted(model, result):
        decodes[model] += 1
        return result

    def health_metadata_and_config():
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("flux1") and client.is_model_ready("wan", "1")
        assert not client.is_model_ready("nope") and not client.is_model_ready("flux1", "7")
        assert client.get_server_metadata()["name"] == "vaedecode"
        meta = client.get_model_metadata("flux1")
        assert meta["platform"] == "vaedecode_autoencoder_kl", meta
        assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [("latent", "FP32", [-1, 16, -1, -1])]
        assert [(t["name"], t["shape"]) for t in meta["outputs"]] == [("sample", [-1, 3, -1, -1])]
        assert client.get_model_metadata("wan")["inputs"][0]["shape"] == [-1, 16, -1, -1, -1]
        config = client.get_model_config("wan")
        assert config["max_batch_size"] == 0 and config["input"][0]["dims"] == [-1, 16, -1, -1, -1], config
        assert config["input"][0]["data_type"] == "TYPE_FP32" and config["output"][0]["dims"] == [-1, 3, -1, -1, -1]
        assert config["parameters"]["latent_datatypes"]["string_value"] == "FP32,FP16,BF16", config["parameters"]
        assert "UINT8" in config["parameters"]["sample_datatypes"]["string_value"]
        index = client.get_model_repository_index()
        assert sorted((m["name"], m["state"]) for m in index) == [("flux1", "READY"), ("wan", "READY")], index
        expect_error(lambda: client.get_model_metadata("nope"), "404", "flux1")
        expect_error(lambda: client.get_model_config("flux1", "7"), "version 1 only")

    def image_infer_matches_grpc_and_diffusers():
        out = counted("flux1", infer(client, "flux1", pipeline_latent, latent_space="raw", scaling_factor=FLUX_SCALE,
                                     shift_factor=FLUX_SHIFT))
        assert out.dtype == np.float32 and out.shape == (1, 3, 136, 184), (out.dtype, out.shape)
        assert np.abs(out - expected).max() <= 1e-4
        ref = np.load(grpc_decode("flux1", fixture("flux1_kl", "pipeline_latent.safetensors"), "flux.npy",
                                  "--latent_space=raw"))
        assert np.abs(out - ref).max() <= 1e-6

    def json_tensors_both_ways():
        latent = load(fixture("flux1_kl", "latent.safetensors"))
        out = counted("flux1", infer(client, "flux1", latent, binary=False))
        assert out.dtype == np.float32 and np.abs(out - expected).max() <= 1e-4
        pixels = counted("flux1", infer(client, "flux1", latent, binary=False, output_format="uint8"))
        assert pixels.dtype == np.uint8 and pixels.shape == (1, 136, 184, 3), (pixels.dtype, pixels.shape)

    def video_infer_matches_grpc_and_diffusers():
        latent = load(fixture("wan21", "latent.safetensors"))
        out = counted("wan", infer(client, "wan", latent, mode="exact"))
        ref = load(fixture("wan21", "expected.safetensors"))
        assert out.shape == ref.shape == (1, 3, 13, 56, 40) and np.abs(out - ref).max() <= 1e-4
        grpc_out = np.load(grpc_decode("wan", fixture("wan21", "latent.safetensors"), "wan.npy", "--mode=exact"))
        assert np.abs(out - grpc_out).max() <= 1e-6

    def fp16_input_uint8_and_png_outputs():
        latent = load(fixture("flux1_kl", "latent.safetensors"))
        out = counted("flux1", infer(client, "flux1", latent.astype(np.float16), "FP16", output_format="uint8"))
        f16 = TMP / "latent_f16.safetensors"
        safetensors.numpy.save_file({"latent": latent.astype(np.float16)}, str(f16))
        assert np.array_equal(out, np.load(grpc_decode("flux1", f16, "flux_u8.npy", "--output_format=uint8")))
        png = counted("flux1", infer(client, "flux1", latent, output_format="png"))
        assert png.dtype == np.object_ and png.shape == (1,), (png.dtype, png.shape)
        assert png[0] == grpc_decode("flux1", fixture("flux1_kl", "latent.safetensors"), "flux.png").read_bytes()

    def bad_requests_name_the_problem():
        latent = load(fixture("flux1_kl", "latent.safetensors"))
        wrong = httpclient.InferInput("z", list(latent.shape), "FP32")
        wrong.set_data_from_numpy(latent)
        expect_error(lambda: client.infer("flux1", [wrong]), "400", "expected one input \"latent\"")
        expect_error(lambda: infer(client, "flux1", latent, colour="red"), "parameter \"colour\": unknown")
        expect_error(lambda: infer(client, "flux1", latent[:, :4]), "takes 16 latent channels, got 4")
        expect_error(lambda: infer(client, "nope", latent), "404", "flux1")
        expect_error(lambda: infer(client, "flux1", latent, binary=False, output_format="png"), "no JSON form")
        ranked = httpclient.InferInput("latent", list(latent.shape), "FP32")
        ranked.set_data_from_numpy(latent)
        expect_error(lambda: client.infer("flux1", [ranked], outputs=[httpclient.InferRequestedOutput("sample",
                                                                                                    class_count=2)]),
                     "\"classification\" is not supported")
        big = np.random.default_rng(0).standard_normal((1, 16, 48, 48), dtype=np.float32)
        expect_error(lambda: infer(client, "flux1", big), "429", "the output is 1.7 MiB")
        broken = requests.post(f"{server.http}/v2/models/flux1/infer", data=b"{not json")
        assert broken.status_code == 400 and "JSON" in broken.json()["error"], broken.text
        # What Triton has and vaedecode does not: said, not a bare 404.
        expect_error(lambda: client.load_model("flux1"), "501", "does not serve POST /v2/repository/models/flux1/load")
        expect_error(lambda: client.get_system_shared_memory_status(), "501", "/v2/systemsharedmemory/status")
        put = requests.put(f"{server.http}/v2/models/flux1/infer", data=b"{}")
        assert put.status_code == 405 and put.headers["Allow"] == "POST", put.status_code
        # And the server still serves.
        assert np.abs(counted("flux1", infer(client, "flux1", latent)) - expected).max() <= 1e-4

    def statistics_count_the_decodes():
        stats = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
        for model, n in decodes.items():
            s = stats[model]
            assert s["execution_count"] >= n and s["inference_stats"]["success"]["count"] >= n, (model, n, s)
            assert s["inference_stats"]["compute_infer"]["ns"] > 0 and s["last_inference"] > 0, s
        assert stats["flux1"]["inference_stats"]["fail"]["count"] >= 5, stats["flux1"]
        one = client.get_inference_statistics("wan")["model_stats"]
        assert [s["name"] for s in one] == ["wan"]

    def encode_with_the_operation_parameter():
        image = safetensors.numpy.load_file(str(fixture("flux1_kl", "image.safetensors")))["image"]
        mean = safetensors.numpy.load_file(str(fixture("flux1_kl", "posterior_mean.safetensors")))["mean"]
        for binary in (True, False):
            image_input = httpclient.InferInput("image", list(image.shape), "FP32")
            image_input.set_data_from_numpy(image, binary_data=binary)
            result = client.infer("flux1", [image_input],
                                  outputs=[httpclient.InferRequestedOutput("latent", binary_data=binary)],
                                  parameters={"operation": "encode"})
            out = result.as_numpy("latent")
            assert out.shape == mean.shape and np.abs(out - mean).max() <= 1e-4, (binary, out.shape)

    def metrics_and_log_count_oip_http_calls():
        text = server.scrape()
        lines = [line for line in text.splitlines()
                 if line.startswith("vaedecode_requests_total{") and 'protocol="oip_http"' in line]
        ok = sum(float(line.rsplit(" ", 1)[1]) for line in lines if 'status="OK"' in line)
        refused = sum(float(line.rsplit(" ", 1)[1]) for line in lines if 'status="INVALID_ARGUMENT"' in line)
        assert ok >= sum(decodes.values()) and refused >= 4, (ok, refused)
        logged = [line for line in server.log_path.read_text().splitlines() if "protocol=oip_http" in line]
        assert len(logged) >= ok + refused, len(logged)

    for name, fn in list(locals().items()):  # the checks above, in order
        if isinstance(fn, types.FunctionType) and name not in ("grpc_decode", "counted") and fn.__code__.co_argcount == 0:
            checks.run(name, fn)
    client.close()
    server.stop()
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
