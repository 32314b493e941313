"""LTX's timestep-conditioned decode (decode_timestep, decode_noise_scale,
noise_seed) against diffusers itself: a timestep-conditioned
AutoencoderKLLTX2Video with seeded random weights, saved by diffusers and
served by a real vaedecode_server (two CPU ranks), decoded through the Open
Inference Protocol (tritonclient) and HTTP, compared with what
LTX2Pipeline's decode step computes with the same seed:

    noise = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    z = (1 - s) * latent + s * noise          (s: decode_noise_scale, default decode_timestep)
    z = _denormalize_latents(z)               (raw latents)
    sample = vae.decode(z, temb=[decode_timestep] * B).sample

in exact, dense and tiled modes, with batch 2; a drawn seed is returned
and reproduces the decode; a model that is not conditioned refuses the
parameters by name.
"""

import json
import sys
import types

import numpy as np
import torch
import tritonclient.grpc as grpcclient
from diffusers import AutoencoderKLLTX2Video
from tritonclient.utils import InferenceServerException

from protocol_harness import TMP, Checks, Server, fixture

TOLERANCE = 1e-4


def make_model():
    config = json.loads(fixture("ltx2", "config.json").read_text())
    config["timestep_conditioning"] = True
    config.pop("_diffusers_version", None)
    config.pop("_class_name", None)
    torch.manual_seed(11)
    vae = AutoencoderKLLTX2Video(**config).eval()
    with torch.no_grad():
        vae.latents_mean.copy_(torch.randn(vae.latents_mean.shape) * 0.1)
        vae.latents_std.copy_(torch.rand(vae.latents_std.shape) + 0.5)
    folder = TMP / "ltx_timestep"
    vae.save_pretrained(str(folder))
    return vae, folder


def reference(vae, latent, timestep, noise_scale, seed, raw):
    z = torch.from_numpy(latent)
    if noise_scale:
        noise = torch.randn(z.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
        z = (1 - noise_scale) * z + noise_scale * noise
    if raw:
        c = z.shape[1]
        z = z * vae.latents_std.view(1, c, 1, 1, 1) / vae.config.scaling_factor + vae.latents_mean.view(1, c, 1, 1, 1)
    with torch.no_grad():
        return vae.decode(z, temb=torch.tensor([timestep] * z.shape[0], dtype=torch.float32)).sample.numpy()


def infer(client, latent, **parameters):
    tensor = grpcclient.InferInput("latent", list(latent.shape), "FP32")
    tensor.set_data_from_numpy(latent)
    result = client.infer("ltx", [tensor], parameters=parameters)
    return result.as_numpy("sample"), result.get_response().parameters


def main():
    vae, folder = make_model()
    server = Server({"ltx": folder, "flux1": "flux1_kl"})
    client = grpcclient.InferenceServerClient(server.grpc)
    checks = Checks("ltx_decode_noise")
    rng = np.random.default_rng(5)
    latent = rng.standard_normal((1, 128, 3, 2, 3), dtype=np.float32)
    batch = rng.standard_normal((2, 128, 2, 2, 3), dtype=np.float32)

    def reports_timestep_conditioning():
        meta = client.get_model_metadata("ltx")
        assert meta.platform == "vaedecode_ltx2", meta.platform
        # vaedecode.v1's ModelInfo says which models take a decode timestep.
        listed = {line.split()[0]: line for line in server.client("--list_models").splitlines()}
        assert "timestep_conditioning=yes" in listed["ltx"], listed
        assert "timestep_conditioning" not in listed["flux1"], listed

    def timestep_without_noise():
        out, params = infer(client, latent, decode_timestep=0.05, decode_noise_scale=0.0, mode="exact")
        ref = reference(vae, latent, 0.05, 0.0, 0, raw=False)
        assert out.shape == ref.shape, (out.shape, ref.shape)
        assert np.abs(out - ref).max() <= TOLERANCE, np.abs(out - ref).max()
        assert "noise_seed" not in params
        # A different timestep is a different decode: the conditioning reaches the decoder.
        other, _ = infer(client, latent, decode_timestep=0.5, decode_noise_scale=0.0, mode="exact")
        assert np.abs(other - out).max() > 1e-3

    def default_timestep_is_zero():
        out, _ = infer(client, latent, mode="exact")
        ref = reference(vae, latent, 0.0, 0.0, 0, raw=False)
        assert np.abs(out - ref).max() <= TOLERANCE, np.abs(out - ref).max()

    def noise_matches_diffusers_in_every_mode():
        ref = reference(vae, latent, 0.05, 0.025, 42, raw=False)
        for mode in ("exact", "dense", "tiled"):
            out, params = infer(client, latent, decode_timestep=0.05, decode_noise_scale=0.025, noise_seed=42,
                                mode=mode)
            assert params["noise_seed"].uint64_param == 42
            assert np.abs(out - ref).max() <= TOLERANCE, (mode, np.abs(out - ref).max())

    def noise_scale_defaults_to_the_timestep_on_raw_latents():
        ref = reference(vae, batch, 0.05, 0.05, 7, raw=True)
        out, _ = infer(client, batch, decode_timestep=0.05, noise_seed=7, latent_space="raw", mode="exact")
        assert out.shape == ref.shape and out.shape[0] == 2, out.shape
        assert np.abs(out - ref).max() <= TOLERANCE, np.abs(out - ref).max()

    def a_drawn_seed_reproduces_the_decode():
        out, params = infer(client, latent, decode_timestep=0.1, mode="exact")
        seed = params["noise_seed"].uint64_param
        again, _ = infer(client, latent, decode_timestep=0.1, noise_seed=seed, mode="exact")
        assert np.array_equal(out, again)
        assert np.abs(out - reference(vae, latent, 0.1, 0.1, seed, raw=False)).max() <= TOLERANCE

    def http_takes_the_same_parameters():
        import requests  # pylint: disable=import-outside-toplevel
        reply = requests.post(f"{server.http}/models/ltx",
                              params={"shape": list(latent.shape), "dtype": "float32", "output_type": "pt",
                                      "decode_timestep": 0.05, "decode_noise_scale": 0.025, "noise_seed": 42},
                              data=latent.tobytes(), headers={"Content-Type": "tensor/binary"})
        assert reply.status_code == 200, reply.text
        assert reply.headers["X-Vaedecode-Noise-Seed"] == "42"
        out = np.frombuffer(reply.content, dtype=np.float32).reshape(json.loads(reply.headers["shape"]))
        assert np.abs(out - reference(vae, latent, 0.05, 0.025, 42, raw=False)).max() <= TOLERANCE

    def unconditioned_models_refuse_by_name():
        flux = np.zeros((1, 16, 4, 4), dtype=np.float32)
        tensor = grpcclient.InferInput("latent", list(flux.shape), "FP32")
        tensor.set_data_from_numpy(flux)
        try:
            client.infer("flux1", [tensor], parameters={"decode_timestep": 0.05})
        except InferenceServerException as e:
            assert "not timestep-conditioned" in e.message(), e.message()
        else:
            raise AssertionError("an unconditioned model took a decode timestep")
        try:
            infer(client, latent, decode_timestep=-1.0)
        except InferenceServerException as e:
            assert "decode_timestep" in e.message() and ": -1" in e.message() and ">= 0" in e.message(), e.message()
        else:
            raise AssertionError("a negative timestep decoded")

    for name, fn in list(locals().items()):  # the checks above, in order
        if isinstance(fn, types.FunctionType) and name != "main" and fn.__code__.co_argcount == 0:
            checks.run(name, fn)
    client.close()
    server.stop()
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
