"""diffusers' own remote_encode() (unmodified, from PyPI) against a real
vaedecode_server's --http_listen (POST /models/NAME/encode), compared with
diffusers' encode fixtures and with diffusers itself at test time:

  - a float tensor [B, C, H, W] in [-1, 1]: the posterior mean within 1e-4
    of diffusers', exact over the group's two ranks (X-Vaedecode-Mode);
  - scaling_factor / shift_factor: (mean - shift) * scale, as the client
    promises; a seeded sample (posterior=sample&seed=N on the endpoint)
    equals diffusers' latent_dist.sample(generator) draw;
  - a PIL image (sent as PNG): the encode of diffusers' VaeImageProcessor's
    preprocessing of the same image, by diffusers' own AutoencoderKL;
  - a video model: a [B, C, T, H, W] clip, and a still image as one frame;
    an MP4 body as its frames (an image model and a lying header refused);
  - MiniMax-H3: a PNG ImageNet-normalised, raw with seed 42 equal to the
    released pipeline's conditioning latent (encode_vae_condition's recipe);
  - bad requests: the error remote_encode raises names the problem, and the
    server goes on encoding;
  - vaedecode_client --image (the gRPC Encode, streamed in pieces): the same
    latent as remote_encode, moments as mean / logvar, a seeded sample, a PNG;
    the Python client's --image the same.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import requests
import safetensors.torch
import torch
from diffusers import AutoencoderKL, AutoencoderKLMiniMaxH3
from diffusers.image_processor import VaeImageProcessor
from diffusers.utils.remote_utils import remote_encode
from PIL import Image

from protocol_harness import TMP, Checks, Server, fixture

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # MiniMaxH3ModularPipeline.pixel_mean / pixel_std
IMAGENET_STD = (0.229, 0.224, 0.225)

FLUX_SCALE, FLUX_SHIFT = 0.3611, 0.1159  # the flux1_kl fixture's config
RUNFILES = pathlib.Path(os.environ["TEST_SRCDIR"]) / "vaedecode"


def load(folder, name, tensor):
    return safetensors.torch.load_file(str(fixture(folder, name)))[tensor]


def max_diff(a, b):
    assert tuple(a.shape) == tuple(b.shape), (tuple(a.shape), tuple(b.shape))
    return (a.double() - b.double()).abs().max().item()


def expect_raises(fn, *needles):
    try:
        fn()
    except RuntimeError as e:  # remote_encode raises RuntimeError(response.json())
        text = str(e)
        for needle in needles:
            assert needle in text, f"{needle!r} not in {text!r}"
        return text
    raise AssertionError("the bad request encoded")


def encode_cases(folder):
    return json.loads(fixture(folder, "meta.json").read_text())["encode_cases"]


def main():
    torch.set_num_threads(2)
    server = Server({"flux1": "flux1_kl", "sd": "sd_kl", "wan": "wan21", "minimax": "minimax_h3"})
    flux = f"{server.http}/models/flux1/encode"
    checks = Checks("remote_encode")
    image = load("flux1_kl", "image.safetensors", "image")
    mean = load("flux1_kl", "posterior_mean.safetensors", "mean")

    def tensor_mean_matches_diffusers():
        out = remote_encode(flux, image)
        assert out.dtype == torch.float32, out.dtype
        d = max_diff(out, mean)
        assert d <= 1e-4, d
        # Exact over the group, as the reply says.
        reply = requests.post(flux, data=image.contiguous().numpy().tobytes(),
                              params={"shape": list(image.shape), "dtype": "float32"})
        assert reply.ok and reply.headers["X-Vaedecode-Mode"] == "MODE_EXACT", (reply.status_code, reply.headers)

    def scaling_and_seeded_sample():
        out = remote_encode(flux, image, scaling_factor=FLUX_SCALE, shift_factor=FLUX_SHIFT)
        want = (mean - FLUX_SHIFT) * FLUX_SCALE
        assert max_diff(out, want) <= 1e-4, max_diff(out, want)
        case = next(c for c in encode_cases("flux1_kl") if c["case"] == "main")
        seed = case["sample_seed"]
        sample = remote_encode(f"{flux}?posterior=sample&seed={seed}", image)
        want = load("flux1_kl", "posterior_sample.safetensors", "sample")
        assert max_diff(sample, want) <= 1e-4, max_diff(sample, want)

    def pil_image_as_diffusers_preprocesses_it():
        rng = np.random.default_rng(3)
        pil = Image.fromarray(rng.integers(0, 256, (40, 24, 3), dtype=np.uint8))
        out = remote_encode(f"{server.http}/models/sd/encode", pil)
        vae = AutoencoderKL.from_pretrained(str(fixture("sd_kl"))).eval()
        pixels = VaeImageProcessor().preprocess(pil)  # [1, 3, 40, 24] in [-1, 1]
        with torch.no_grad():
            want = vae.encode(pixels).latent_dist.mean
        assert tuple(out.shape) == (1, 4, 10, 6), tuple(out.shape)
        assert max_diff(out, want) <= 1e-4, max_diff(out, want)

    def minimax_png_as_the_released_pipeline_encodes_it():
        # MiniMax-H3's pixels are ImageNet-normalised: a PNG is, and raw with
        # seed 42 is the conditioning latent of the modular pipeline's
        # encode_vae_condition (its recipe, written out: the module imports
        # transformers), computed here by diffusers' AutoencoderKLMiniMaxH3.
        pixels = np.random.default_rng(4).integers(0, 256, (48, 80, 3), dtype=np.uint8)
        got = remote_encode(f"{server.http}/models/minimax/encode?posterior=sample&seed=42&latent_space=raw",
                            Image.fromarray(pixels))
        vae = AutoencoderKLMiniMaxH3.from_pretrained(str(fixture("minimax_h3"))).eval()
        x = torch.from_numpy(pixels).permute(2, 0, 1)[None, :, None].float().div(255.0)
        x = (x - torch.tensor(IMAGENET_MEAN).view(1, -1, 1, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, -1, 1, 1, 1)
        with torch.no_grad():
            latents = vae.encode(x).latent_dist.sample(generator=torch.Generator().manual_seed(42))
        latents = latents.to(torch.float16).float()
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
        want = (latents - mean) / std
        assert tuple(got.shape) == tuple(want.shape), (got.shape, want.shape)
        # Rounded to float16 on both sides: equal but for the rare value on a rounding edge.
        d = max_diff(got, want)
        assert d <= 1e-3 and float((got - want).abs().mean()) <= 1e-5, d

    def video_clip_and_still_frame():
        clip = load("wan21", "image.safetensors", "image")
        out = remote_encode(f"{server.http}/models/wan/encode", clip)
        want = load("wan21", "posterior_mean.safetensors", "mean")
        assert max_diff(out, want) <= 1e-4, max_diff(out, want)
        still = Image.fromarray(np.full((48, 32, 3), 128, dtype=np.uint8))
        frame = remote_encode(f"{server.http}/models/wan/encode", still)
        assert tuple(frame.shape) == (1, 16, 1, 6, 4), tuple(frame.shape)

    def mp4_clip_encodes_as_its_frames():
        # An MP4 body (the service's own MP4 of the wan21 latent, through
        # vaedecode_client) encodes as its 13 frames, the same over HTTP and
        # through the gRPC client's --image (that the frames are FFmpeg's
        # decode to the bit: formats/image_input_test).
        latent = fixture("wan21", "latent.safetensors")
        mp4, by_client = TMP / "clip.mp4", TMP / "mp4_latent.safetensors"
        server.client("--model=wan", f"--latent={latent}", f"--out={mp4}")
        reply = requests.post(f"{server.http}/models/wan/encode", data=mp4.read_bytes())
        assert reply.ok, (reply.status_code, reply.text)
        shape = json.loads(reply.headers["shape"])
        got = torch.frombuffer(bytearray(reply.content), dtype=torch.float32).reshape(shape)
        assert tuple(got.shape) == (1, 16, 4, 7, 5), got.shape
        line = server.client("--model=wan", f"--image={mp4}", f"--out={by_client}", "--piece_bytes=1024")
        assert "mode=MODE_EXACT" in line, line
        assert max_diff(safetensors.torch.load_file(str(by_client))["latent"], got) == 0.0
        # An image model takes no clip; a lying MP4 is refused naming both sizes.
        refused = requests.post(flux, data=mp4.read_bytes())
        assert refused.status_code == 400 and "an MP4 is a clip" in refused.text, (refused.status_code, refused.text)
        lying = bytearray(mp4.read_bytes())
        stsz = lying.find(b"stsz")
        lying[stsz + 4 + 8 + 3] += 2
        refused = requests.post(f"{server.http}/models/wan/encode", data=bytes(lying))
        assert refused.status_code == 400 and "but decodes to" in refused.text, (refused.status_code, refused.text)
        assert max_diff(remote_encode(flux, image), mean) <= 1e-4  # still encoding

    def bad_requests_name_the_problem():
        expect_raises(lambda: remote_encode(flux, image.to(torch.float64)), "dtype", "float64")
        expect_raises(lambda: remote_encode(f"{flux}?latent_space=raw", image, scaling_factor=FLUX_SCALE),
                      "latent_space", "contradicts")
        expect_raises(lambda: remote_encode(f"{flux}?posterior=median", image), "posterior", "mean, sample")
        six = torch.zeros(1, 3, 6, 24, 40)
        expect_raises(lambda: remote_encode(f"{server.http}/models/wan/encode", six), "1 + 4·k frames")
        expect_raises(lambda: remote_encode(f"{server.http}/models/nope/encode", image), "nope", "flux1")
        # Still encoding.
        assert max_diff(remote_encode(flux, image), mean) <= 1e-4

    def grpc_client_encodes_the_same():
        out = TMP / "client_mean.safetensors"
        line = server.client("--model=flux1", f"--image={fixture('flux1_kl', 'image.safetensors')}", f"--out={out}",
                             "--piece_bytes=4096", "--mode=exact")
        assert "mode=MODE_EXACT" in line, line
        got = safetensors.torch.load_file(str(out))["latent"]
        assert max_diff(got, remote_encode(flux, image)) <= 1e-6 and max_diff(got, mean) <= 1e-4
        moments = TMP / "client_moments.safetensors"
        server.client("--model=flux1", f"--image={fixture('flux1_kl', 'image.safetensors')}", f"--out={moments}",
                      "--posterior=moments")
        both = safetensors.torch.load_file(str(moments))
        logvar = load("flux1_kl", "posterior_logvar.safetensors", "logvar")
        assert max_diff(both["mean"], mean) <= 1e-4 and max_diff(both["logvar"], logvar) <= 1e-4
        case = next(c for c in encode_cases("flux1_kl") if c["case"] == "main")
        sample = TMP / "client_sample.npy"
        line = server.client("--model=flux1", f"--image={fixture('flux1_kl', 'image.safetensors')}", f"--out={sample}",
                             "--posterior=sample", f"--seed={case['sample_seed']}")
        assert f"sample_seed={case['sample_seed']}" in line, line
        want = load("flux1_kl", "posterior_sample.safetensors", "sample")
        assert max_diff(torch.from_numpy(np.load(sample)), want) <= 1e-4
        png = TMP / "still.png"
        Image.fromarray(np.full((48, 32, 3), 90, dtype=np.uint8)).save(png)
        frame = TMP / "still_latent.safetensors"
        server.client("--model=wan", f"--image={png}", f"--out={frame}")
        assert tuple(safetensors.torch.load_file(str(frame))["latent"].shape) == (1, 16, 1, 6, 4)

    def python_client_encodes_the_same():
        # Debian's python3 with python3-grpcio, the stubs beside the client in the runfiles.
        client = RUNFILES / "client" / "python" / "vaedecode_client.py"
        image_npy = TMP / "image.npy"
        np.save(image_npy, image.numpy())
        out = TMP / "py_mean.npy"
        done = subprocess.run(["/usr/bin/python3", str(client), f"--server={server.grpc}", "--model=flux1",
                               f"--image={image_npy}", f"--out={out}", "--mode=exact"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "mode=MODE_EXACT" in done.stdout, done.stdout
        got = torch.from_numpy(np.load(out))
        assert max_diff(got, remote_encode(flux, image)) <= 1e-6 and max_diff(got, mean) <= 1e-4

    checks.run("tensor_mean_matches_diffusers_exactly_sharded", tensor_mean_matches_diffusers)
    checks.run("python_client_encodes_the_same", python_client_encodes_the_same)
    checks.run("grpc_client_encodes_the_same", grpc_client_encodes_the_same)
    checks.run("scaling_shift_and_seeded_sample", scaling_and_seeded_sample)
    checks.run("pil_image_as_diffusers_preprocesses_it", pil_image_as_diffusers_preprocesses_it)
    checks.run("video_clip_and_still_frame", video_clip_and_still_frame)
    checks.run("minimax_png_as_the_released_pipeline_encodes_it", minimax_png_as_the_released_pipeline_encodes_it)
    checks.run("mp4_clip_encodes_as_its_frames", mp4_clip_encodes_as_its_frames)
    checks.run("bad_requests_name_the_problem", bad_requests_name_the_problem)
    server.stop()
    sys.exit(checks.finish())


if __name__ == "__main__":
    main()
