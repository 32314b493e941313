"""diffusers' own remote_decode() (unmodified, from PyPI) against a real
vaedecode_server's --http_listen, compared with the gRPC path (the C++
vaedecode_client) on the same latents and with diffusers' fixture decodes:

  - pt: float32 [B, C, H, W] equal to vaedecode.v1.Decode's (1e-6) and to
    diffusers' decode (1e-4), the latent de-normalised with the request's
    scaling_factor / shift_factor or (do_scaling) with the model's own;
  - pt + partial_postprocess: uint8 [B, H, W, C] equal to OUTPUT_UINT8;
  - pil jpg / png: the very files vaedecode.v1.Decode makes (JPEG, PNG);
  - a packed FLUX latent [B, (H/16)·(W/16), 64] with height / width decodes
    like its unpacked [B, 16, H/8, W/8];
  - a video model: pt [B, C, T, H, W] equal to the gRPC path and to
    diffusers; pil through a VideoProcessor: T frames of the right size;
    mp4: H.264 yuv420p, T frames back through PyAV, close to the uint8 frames;
  - bad requests: the error remote_decode raises names the problem, and the
    server goes on serving; /metrics counts the calls with protocol="http".
"""

import io
import json
import sys
import types

import av
import numpy as np
import requests
import safetensors.torch
import torch
from diffusers.utils.remote_utils import remote_decode
from diffusers.video_processor import VideoProcessor
from PIL import Image

from protocol_harness import TMP, Checks, Server, fixture

FLUX_SCALE, FLUX_SHIFT = 0.3611, 0.1159  # the flux1_kl fixture's config


def load(path):
    tensors = safetensors.torch.load_file(str(path))
    return next(iter(tensors.values())) if len(tensors) == 1 else tensors["latent"]


def save_latent(tensor, name):
    path = TMP / name
    safetensors.torch.save_file({"latent": tensor.contiguous()}, str(path))
    return path


def max_diff(a, b):
    return (a.double() - b.double()).abs().max().item()


def expect_raises(fn, *needles):
    try:
        fn()
    except RuntimeError as e:  # remote_decode raises RuntimeError(response.json())
        text = str(e)
        for needle in needles:
            assert needle in text, f"{needle!r} not in {text!r}"
        return text
    raise AssertionError("the bad request decoded")


def main():
    server = Server({"flux1": "flux1_kl", "sd": "sd_kl", "wan": "wan21", "qwen21": "qwenimage21",
                     "hunyuan3": "hunyuanimage3"})
    flux = f"{server.http}/models/flux1"
    checks = Checks("remote_decode")
    pipeline_latent = load(fixture("flux1_kl", "pipeline_latent.safetensors"))
    expected = load(fixture("flux1_kl", "expected.safetensors"))
    grpc = {}

    def grpc_decode(model, latent_path, out_name, *flags):
        out = TMP / out_name
        server.client(f"--model={model}", f"--latent={latent_path}", f"--out={out}", *flags)
        return out

    def pt_matches_grpc_and_diffusers():
        out = remote_decode(flux, pipeline_latent, scaling_factor=FLUX_SCALE, shift_factor=FLUX_SHIFT,
                            output_type="pt", return_type="pt")
        assert out.dtype == torch.float32 and tuple(out.shape) == (1, 3, 136, 184), (out.dtype, out.shape)
        ref = grpc_decode("flux1", fixture("flux1_kl", "pipeline_latent.safetensors"), "flux_grpc.npy",
                          "--latent_space=raw")
        grpc["flux_pt"] = torch.from_numpy(np.load(ref))
        assert max_diff(out, grpc["flux_pt"]) <= 1e-6, max_diff(out, grpc["flux_pt"])
        assert max_diff(out, expected) <= 1e-4, max_diff(out, expected)

    def do_scaling_uses_the_models_formula():
        # remote_decode's default (do_scaling=True, no factors): the model's raw formula.
        out = remote_decode(flux, pipeline_latent, output_type="pt", return_type="pt")
        assert max_diff(out, expected) <= 1e-4, max_diff(out, expected)
        # do_scaling=False: the latent is already what vae.decode takes.
        vae_latent = load(fixture("flux1_kl", "latent.safetensors"))
        out = remote_decode(flux, vae_latent, do_scaling=False, output_type="pt", return_type="pt")
        assert max_diff(out, expected) <= 1e-4, max_diff(out, expected)

    def pt_partial_postprocess_is_uint8():
        out = remote_decode(flux, pipeline_latent, scaling_factor=FLUX_SCALE, shift_factor=FLUX_SHIFT,
                            output_type="pt", partial_postprocess=True, return_type="pt")
        assert out.dtype == torch.uint8 and tuple(out.shape) == (1, 136, 184, 3), (out.dtype, out.shape)
        ref = grpc_decode("flux1", fixture("flux1_kl", "pipeline_latent.safetensors"), "flux_u8.npy",
                          "--latent_space=raw", "--output_format=uint8")
        assert torch.equal(out, torch.from_numpy(np.load(ref)))
        # return_type pil: remote_decode makes the PIL image itself.
        image = remote_decode(flux, pipeline_latent, scaling_factor=FLUX_SCALE, shift_factor=FLUX_SHIFT,
                              output_type="pt", partial_postprocess=True, return_type="pil")
        assert image.size == (184, 136)
        assert np.array_equal(np.asarray(image), out[0].numpy())

    def pil_files_equal_grpc():
        for image_format, ext, pil_format in (("jpg", "jpg", "jpeg"), ("png", "png", "png")):
            image = remote_decode(flux, pipeline_latent, scaling_factor=FLUX_SCALE, shift_factor=FLUX_SHIFT,
                                  output_type="pil", image_format=image_format)
            assert image.format == pil_format, image.format
            assert image.size == (184, 136), image.size
            ref = grpc_decode("flux1", fixture("flux1_kl", "pipeline_latent.safetensors"), f"flux.{ext}",
                              "--latent_space=raw")
            assert np.array_equal(np.asarray(image), np.asarray(Image.open(ref).convert("RGB"))), image_format
        # The same bytes, not just the same pixels: the raw reply against the gRPC file.
        reply = requests.post(flux, params={"shape": list(pipeline_latent.shape), "dtype": "float32",
                                            "scaling_factor": FLUX_SCALE, "shift_factor": FLUX_SHIFT,
                                            "output_type": "pil", "image_format": "jpg"},
                              data=pipeline_latent.numpy().tobytes(), headers={"Content-Type": "tensor/binary"})
        assert reply.status_code == 200 and reply.headers["Content-Type"] == "image/jpeg", reply.headers
        assert reply.content == (TMP / "flux.jpg").read_bytes(), "JPEG bytes differ from the gRPC path's"

    def packed_flux_latent_with_height_and_width():
        torch.manual_seed(3)
        z = torch.randn(1, 16, 8, 10)  # an 64x80 image's latent
        # FluxPipeline._pack_latents: 2x2 patches of 16 channels -> [B, 20, 64].
        packed = z.view(1, 16, 4, 2, 5, 2).permute(0, 2, 4, 1, 3, 5).reshape(1, 20, 64)
        out = remote_decode(flux, packed, scaling_factor=FLUX_SCALE, shift_factor=FLUX_SHIFT, height=64,
                            width=80, output_type="pt", return_type="pt")
        unpacked = remote_decode(flux, z, scaling_factor=FLUX_SCALE, shift_factor=FLUX_SHIFT,
                                 output_type="pt", return_type="pt")
        assert tuple(out.shape) == (1, 3, 64, 80), out.shape
        assert torch.equal(out, unpacked), max_diff(out, unpacked)

    def float16_and_bfloat16_latents():
        for dtype in (torch.float16, torch.bfloat16):
            out = remote_decode(flux, pipeline_latent.to(dtype), scaling_factor=FLUX_SCALE,
                                shift_factor=FLUX_SHIFT, output_type="pt", return_type="pt")
            # Only the latent's rounding differs: the output stays close.
            assert tuple(out.shape) == (1, 3, 136, 184) and max_diff(out, expected) < 0.1, dtype

    def image_batch_of_two():
        latent = load(fixture("sd_kl", "latent_b2.safetensors"))
        out = remote_decode(f"{server.http}/models/sd", latent, do_scaling=False, output_type="pt",
                            return_type="pt")
        ref = load(fixture("sd_kl", "expected_b2.safetensors"))
        assert tuple(out.shape) == tuple(ref.shape) and max_diff(out, ref) <= 1e-4, max_diff(out, ref)

    def rgba_image_model_pt_matches_grpc_and_diffusers():
        # Qwen-Image-2.1 (RGBA, 16x): remote_decode's do_scaling applies its pipeline's formula.
        raw_path = fixture("qwenimage21", "pipeline_latent.safetensors")
        out = remote_decode(f"{server.http}/models/qwen21", load(raw_path), output_type="pt", return_type="pt")
        ref = load(fixture("qwenimage21", "expected.safetensors"))
        assert tuple(out.shape) == tuple(ref.shape) == (1, 4, 1, 112, 64), out.shape
        assert max_diff(out, ref) <= 1e-4, max_diff(out, ref)
        grpc_out = torch.from_numpy(np.load(grpc_decode("qwen21", raw_path, "qwen21.npy", "--latent_space=raw")))
        assert max_diff(out, grpc_out) <= 1e-6, max_diff(out, grpc_out)

    def release_code_model_pt_and_png():
        # Hunyuan Image 3: its pipeline's latents in, its pipeline's image out (the release's
        # vae.decode output without the one-frame axis), as a tensor and as the gRPC PNG.
        raw_path = fixture("hunyuanimage3", "pipeline_latent.safetensors")
        url = f"{server.http}/models/hunyuan3"
        out = remote_decode(url, load(raw_path), output_type="pt", return_type="pt")
        ref = load(fixture("hunyuanimage3", "expected.safetensors"))[:, :, 0]
        assert tuple(out.shape) == tuple(ref.shape) == (1, 3, 28, 20), out.shape
        assert max_diff(out, ref) <= 1e-4, max_diff(out, ref)
        image = remote_decode(url, load(raw_path), output_type="pil", image_format="png")
        png = grpc_decode("hunyuan3", raw_path, "hunyuan3.png", "--latent_space=raw")
        assert np.array_equal(np.asarray(image), np.asarray(Image.open(png).convert("RGB")))

    wan = f"{server.http}/models/wan"

    def video_pt_matches_grpc_and_diffusers():
        latent = load(fixture("wan21", "latent.safetensors"))
        out = remote_decode(wan, latent, do_scaling=False, output_type="pt", return_type="pt")
        ref = load(fixture("wan21", "expected.safetensors"))
        assert tuple(out.shape) == tuple(ref.shape) == (1, 3, 13, 56, 40), out.shape
        assert max_diff(out, ref) <= 1e-4, max_diff(out, ref)
        grpc_out = torch.from_numpy(np.load(grpc_decode("wan", fixture("wan21", "latent.safetensors"), "wan.npy")))
        assert max_diff(out, grpc_out) <= 1e-6, max_diff(out, grpc_out)

    def video_pil_frames_through_a_processor():
        latent = load(fixture("wan21", "latent.safetensors"))
        frames = remote_decode(wan, latent, do_scaling=False, processor=VideoProcessor(), output_type="pil")
        assert len(frames) == 13 and all(f.size == (40, 56) for f in frames), (len(frames), frames[0].size)
        u8 = np.load(grpc_decode("wan", fixture("wan21", "latent.safetensors"), "wan_u8.npy",
                                 "--output_format=uint8"))  # [1, T, H, W, C]
        worst = max(int(np.abs(np.asarray(f).astype(int) - u8[0, t].astype(int)).max()) for t, f in enumerate(frames))
        assert worst <= 1, worst  # the client rounds float frames itself
        pixels = remote_decode(wan, latent, do_scaling=False, output_type="pt", partial_postprocess=True,
                               return_type="pt")
        assert tuple(pixels.shape) == (13, 56, 40, 3) and np.array_equal(pixels.numpy(), u8[0])

    def video_mp4_decodes_back_to_its_frames():
        latent = load(fixture("wan21", "latent.safetensors"))
        mp4 = remote_decode(wan, latent, do_scaling=False, output_type="mp4", return_type="mp4")
        assert isinstance(mp4, bytes) and mp4[4:8] == b"ftyp", mp4[:16]
        # Not byte for byte: x264 in the worker does not always make the same
        # file from the same frames (docs/OPERATIONS.md, "Known gaps").
        ref = grpc_decode("wan", fixture("wan21", "latent.safetensors"), "wan.mp4")
        with av.open(str(ref)) as container:
            assert container.streams.video[0].frames in (0, 13) and container.streams.video[0].width == 40
        with av.open(io.BytesIO(mp4)) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name == "h264" and stream.codec_context.pix_fmt == "yuv420p"
            assert float(stream.average_rate) == 16, stream.average_rate
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        assert len(frames) == 13 and frames[0].shape == (56, 40, 3), (len(frames), frames[0].shape)
        u8 = np.load(grpc_decode("wan", fixture("wan21", "latent.safetensors"), "wan_u8.npy",
                                 "--output_format=uint8"))[0]
        # H.264 is lossy and these frames are noise: close on average only.
        error = np.mean([np.abs(f.astype(float) - u8[t]).mean() for t, f in enumerate(frames)])
        assert error < 40, error
        fast = remote_decode(f"{wan}?fps=24", latent, do_scaling=False, output_type="mp4", return_type="mp4")
        with av.open(io.BytesIO(fast)) as container:
            assert float(container.streams.video[0].average_rate) == 24

    def bad_requests_name_the_problem():
        latent = load(fixture("flux1_kl", "latent.safetensors"))
        expect_raises(lambda: remote_decode(f"{server.http}/models/nope", latent, output_type="pt",
                                            return_type="pt"), "not found", "flux1")
        expect_raises(lambda: remote_decode(flux, latent[:, :4], do_scaling=False, output_type="pt",
                                            return_type="pt"), "takes 16 latent channels, got 4")
        expect_raises(lambda: remote_decode(flux, latent, do_scaling=False, output_type="mp4",
                                            return_type="mp4"), "mp4 is for video models")
        expect_raises(lambda: remote_decode(flux, latent[:, :, :, :4].repeat(2, 1, 1, 1), do_scaling=False,
                                            output_type="pil"), "pil returns one image")
        bad = requests.post(flux, params={"shape": [1, 16, 17, 23], "dtype": "int8"}, data=b"\0" * 10)
        assert bad.status_code == 400 and "dtype" in bad.json()["error"], bad.text
        short = requests.post(flux, params={"shape": [1, 16, 17, 23], "dtype": "float32", "output_type": "pt"},
                              data=b"\0" * 10)
        assert short.status_code == 400 and "bytes" in short.json()["error"], short.text
        packed = requests.post(flux, params={"shape": [1, 20, 64], "dtype": "float32"}, data=b"\0" * 5120)
        assert packed.status_code == 400 and "height" in packed.json()["error"], packed.text
        several = requests.post(server.http + "/", params={"shape": [1, 16, 2, 2], "dtype": "float32"},
                                data=b"\0" * 256)
        assert several.status_code == 400 and "/models/NAME" in several.json()["error"], several.text
        # And the server still serves.
        out = remote_decode(flux, latent, do_scaling=False, output_type="pt", return_type="pt")
        assert max_diff(out, expected) <= 1e-4

    def health_and_metrics():
        assert requests.get(f"{server.http}/health").text == "Ok"
        assert requests.get(f"{server.http}/health/wan").text == "Ok"
        missing = requests.get(f"{server.http}/health/nope")
        assert missing.status_code == 503 and "nope" in missing.json()["error"], missing.text
        text = server.scrape()
        http_ok = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                      if line.startswith("vaedecode_requests_total{") and 'protocol="http"' in line
                      and 'status="OK"' in line)
        assert http_ok >= 10, http_ok
        assert any('protocol="grpc"' in line for line in text.splitlines()
                   if line.startswith("vaedecode_requests_total{"))

    for name, fn in list(locals().items()):  # the checks above, in order
        if isinstance(fn, types.FunctionType) and not name.startswith(("grpc_decode", "main")) and fn.__code__.co_argcount == 0:
            checks.run(name, fn)
    server.stop()
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
