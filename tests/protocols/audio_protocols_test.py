"""Audio VAEs over the drop-in protocols, against a real vaedecode_server
(two CPU ranks) serving MiniMax-H3's audio VAE and LTX-2's audio VAE with
its vocoder, compared with the diffusers fixtures:

  - HTTP remote_decode: diffusers' own remote_decode (unmodified, from PyPI)
    with output_type pt on LTX-2's [B, C, L, M] latent returns the waveform;
    pt on MiniMax-H3's [B, C, L] latent and on LTX-2's packed raw latent
    [B, L, C*M]; output_type wav (the audio default: 16-bit PCM, or
    wav_encoding=float32) returns one WAV file; every waveform reply says its
    rate in X-Vaedecode-Sample-Rate; audio_output=mel the mel spectrogram;
  - OIP (tritonclient's gRPC client): FP32 waveforms with the sample_rate
    response parameter, BYTES WAV files with output_format wav, the model's
    metadata [B, C, L] in and [B, channels, samples] out;
  - an audio latent muxed into a video's MP4 (LTX-2's video and audio): over
    HTTP (output_type=mp4, audio_model, audio_shape, the audio latent's bytes
    after the video latent's) and OIP (a second input "audio_latent", the
    parameter audio_model), read back by PyAV (FFmpeg): an H.264 stream of
    the clip's frames and a stereo AAC stream of the whole waveform;
  - vaedecode_client --out a.wav: a WAV per batch entry (a_0.wav, a_1.wav);
    the Python client's .npy of the waveform;
  - bad requests name the problem; the server keeps serving.
"""

import io
import json
import os
import pathlib
import struct
import subprocess
import sys

import av
import numpy as np
import requests
import safetensors.numpy
import safetensors.torch
import torch
import tritonclient.grpc as grpcclient
from diffusers.utils.remote_utils import remote_decode

from protocol_harness import TMP, Checks, Server, expect_oip_error, fixture


def load(folder, name, key=None):
    tensors = safetensors.numpy.load_file(str(fixture(folder, name)))
    return tensors[key] if key else next(iter(tensors.values()))


def parse_wav(data):
    """(format tag, channels, rate, samples [frames, channels] as float)."""
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE", data[:12]
    assert struct.unpack("<I", data[4:8])[0] == len(data) - 8
    at, fmt, samples = 12, None, None
    while at + 8 <= len(data):
        chunk, size = data[at:at + 4], struct.unpack("<I", data[at + 4:at + 8])[0]
        body = data[at + 8:at + 8 + size]
        if chunk == b"fmt ":
            fmt = struct.unpack("<HHIIHH", body[:16])
        elif chunk == b"data":
            tag, channels, rate, bits = fmt[0], fmt[1], fmt[2], fmt[5]
            dtype = np.int16 if bits == 16 else np.float32
            samples = np.frombuffer(body, dtype=dtype).reshape(-1, channels).astype(np.float64)
            if bits == 16:
                samples /= 32767.0
        at += 8 + size + (size & 1)
    return fmt[0], fmt[1], fmt[2], samples


def expect_http_error(response, status, *needles):
    assert response.status_code == status, (response.status_code, response.text)
    text = response.json()["error"]
    for needle in needles:
        assert needle in text, f"{needle!r} not in {text!r}"


def main():
    server = Server({"minimax_audio": "minimax_h3_audio", "ltx2_audio": "ltx2_audio", "sd": "sd_kl",
                     "ltx2_video": "ltx2_full"})
    checks = Checks("audio_protocols")
    minimax_latent = load("minimax_h3_audio", "latent.safetensors")
    minimax_wave = load("minimax_h3_audio", "expected.safetensors")
    ltx2_latent = load("ltx2_audio", "latent.safetensors")
    ltx2_packed = load("ltx2_audio", "pipeline_latent.safetensors")
    ltx2_wave = load("ltx2_audio", "waveform.safetensors")
    ltx2_mel = load("ltx2_audio", "expected.safetensors")
    rates = {}
    for name in ("minimax_audio", "ltx2_audio"):
        rates[name] = json.loads(requests.get(f"{server.http}/v2/models/{name}/config").text)["parameters"][
            "sample_rate"]["string_value"]

    def post(model, latent, **params):
        query = [("shape", d) for d in latent.shape] + [("dtype", "float32")] + list(params.items())
        return requests.post(f"{server.http}/models/{model}", params=query,
                             data=np.ascontiguousarray(latent, dtype=np.float32).tobytes(), timeout=120)

    def tensor_of(response):
        assert response.status_code == 200, response.text
        shape = json.loads(response.headers["shape"])
        return np.frombuffer(response.content, dtype=np.float32).reshape(shape)

    def remote_decode_pt():
        # diffusers' own client, a 4-D latent in VAE space (do_scaling=False:
        # its default asks for the model's de-normalisation): the waveform [1, 2, 5040].
        out = remote_decode(f"{server.http}/models/ltx2_audio", torch.from_numpy(ltx2_latent), output_type="pt",
                            return_type="pt", do_scaling=False)
        assert tuple(out.shape) == ltx2_wave.shape, out.shape
        assert np.abs(out.double().numpy() - ltx2_wave).max() <= 1e-4

    def http_pt_waveforms_with_their_rate():
        for model, latent, wave, params in (("minimax_audio", minimax_latent, minimax_wave, {}),
                                            ("ltx2_audio", ltx2_packed, ltx2_wave, {"latent_space": "raw"})):
            response = post(model, latent, output_type="pt", **params)
            out = tensor_of(response)
            assert out.shape == wave.shape, (model, out.shape)
            assert np.abs(out.astype(np.float64) - wave).max() <= 1e-4, model
            assert response.headers["X-Vaedecode-Sample-Rate"] == rates[model], response.headers
            assert int(rates[model]) > 0

    def http_wav_files():
        for encoding, tag, tolerance in ((None, 1, 1 / 32767), ("float32", 3, 1e-4)):
            params = {} if encoding is None else {"wav_encoding": encoding}
            # output_type defaults to wav for an audio VAE.
            response = post("ltx2_audio", ltx2_latent, **params)
            assert response.status_code == 200, response.text
            assert response.headers["Content-Type"] == "audio/wav"
            fmt_tag, channels, rate, samples = parse_wav(response.content)
            assert (fmt_tag, channels, rate) == (tag, 2, int(rates["ltx2_audio"])), (fmt_tag, channels, rate)
            want = np.clip(ltx2_wave[0].T, -1, 1)  # [samples, channels]
            assert samples.shape == want.shape, samples.shape
            assert np.abs(samples - want).max() <= tolerance

    def http_mel_on_request():
        out = tensor_of(post("ltx2_audio", ltx2_latent, output_type="pt", audio_output="mel"))
        assert out.shape == ltx2_mel.shape and np.abs(out - ltx2_mel).max() <= 1e-4
        # A mel's default reply is its tensor (a waveform's is a WAV).
        out = tensor_of(post("ltx2_audio", ltx2_latent, audio_output="mel"))
        assert out.shape == ltx2_mel.shape

    def http_refusals():
        expect_http_error(post("minimax_audio", minimax_latent, output_type="pil"), 400,
                          "output_type", "is an audio VAE; use wav or pt")
        expect_http_error(post("minimax_audio", minimax_latent, output_type="wav"), 400,
                          "wav returns one file; this latent has a batch of 2")
        expect_http_error(post("ltx2_audio", ltx2_latent, output_type="wav", wav_encoding="mp3"), 400,
                          "wav_encoding", "use pcm16 or float32")
        expect_http_error(post("ltx2_audio", ltx2_latent, output_type="wav", audio_output="mel"), 400,
                          "wav holds audio waveforms", "decodes mel spectrograms")
        expect_http_error(post("sd", np.zeros((1, 4, 8, 8), np.float32), output_type="pt", audio_output="mel"), 400,
                          "MEL is an audio VAE's mel spectrogram")

    client = grpcclient.InferenceServerClient(url=server.grpc)

    def infer(model, latent, **parameters):
        latent_input = grpcclient.InferInput("latent", list(latent.shape), "FP32")
        latent_input.set_data_from_numpy(np.ascontiguousarray(latent, dtype=np.float32))
        return client.infer(model, [latent_input], outputs=[grpcclient.InferRequestedOutput("sample")],
                            parameters=parameters or None)

    def oip_waveform_and_rate():
        result = infer("minimax_audio", minimax_latent)
        out = result.as_numpy("sample")
        assert out.shape == minimax_wave.shape and np.abs(out - minimax_wave).max() <= 1e-4
        rate = result.get_response().parameters["sample_rate"].int64_param
        assert str(rate) == rates["minimax_audio"], rate

    def oip_wav_files():
        result = infer("minimax_audio", minimax_latent, output_format="wav_float32")
        files = result.as_numpy("sample")
        assert files.shape == (2,), files.shape  # one WAV per batch entry
        for b, data in enumerate(files):
            fmt_tag, channels, rate, samples = parse_wav(bytes(data))
            assert (fmt_tag, channels, str(rate)) == (3, 1, rates["minimax_audio"])
            assert np.abs(samples[:, 0] - minimax_wave[b, 0]).max() <= 1e-4

    def oip_metadata():
        meta = client.get_model_metadata("minimax_audio")
        assert list(meta.inputs[0].shape) == [-1, 32, -1], meta.inputs[0].shape
        assert list(meta.outputs[0].shape) == [-1, 1, -1], meta.outputs[0].shape
        meta = client.get_model_metadata("ltx2_audio")
        assert list(meta.inputs[0].shape) == [-1, 4, -1, -1], meta.inputs[0].shape
        assert list(meta.outputs[0].shape) == [-1, 2, -1], meta.outputs[0].shape

    def oip_refusals():
        expect_oip_error(lambda: infer("minimax_audio", minimax_latent, output_format="png"),
                         "INVALID_ARGUMENT", "png holds images or video")
        expect_oip_error(lambda: infer("minimax_audio", np.zeros((1, 32, 4, 4), np.float32)),
                         "INVALID_ARGUMENT", "takes [B, C, L] latents")
        # Still serving.
        assert infer("ltx2_audio", ltx2_latent).as_numpy("sample").shape == ltx2_wave.shape

    video_latent = load("ltx2_full", "latent.safetensors")  # [1, 128, 1, 3, 2]: one frame of 96x64

    def expect_muxed(data, frames, samples, rate):
        container = av.open(io.BytesIO(data))
        video = [s for s in container.streams if s.type == "video"]
        audio = [s for s in container.streams if s.type == "audio"]
        assert len(video) == 1 and len(audio) == 1, container.streams
        assert audio[0].codec_context.name == "aac" and audio[0].codec_context.channels == 2
        assert audio[0].codec_context.sample_rate == rate
        got_frames = sum(1 for _ in container.decode(video[0]))
        container.seek(0)
        decoded = sum(f.samples for f in av.open(io.BytesIO(data)).decode(audio=0))
        assert got_frames == frames, got_frames
        # Every sample: AAC's 1024-sample frames pad the end, its priming is trimmed.
        assert samples <= decoded < samples + 1024 + 1024, (decoded, samples)

    def http_mp4_with_audio():
        query = ([("shape", d) for d in video_latent.shape] + [("dtype", "float32"), ("output_type", "mp4"),
                 ("audio_model", "ltx2_audio"), ("audio_latent_space", "raw")] +
                 [("audio_shape", d) for d in ltx2_packed.shape])
        body = np.ascontiguousarray(video_latent).tobytes() + np.ascontiguousarray(ltx2_packed).tobytes()
        response = requests.post(f"{server.http}/models/ltx2_video", params=query, data=body, timeout=120)
        assert response.status_code == 200, response.text
        assert response.headers["Content-Type"] == "video/mp4"
        expect_muxed(response.content, 1, ltx2_wave.shape[2], 24000)
        # The audio latent's bytes missing, or an audio track on a tensor reply: refused.
        short = requests.post(f"{server.http}/models/ltx2_video", params=query,
                              data=np.ascontiguousarray(video_latent).tobytes(), timeout=120)
        expect_http_error(short, 400, "audio")
        pt = [(k, v) if k != "output_type" else (k, "pt") for k, v in query]
        expect_http_error(requests.post(f"{server.http}/models/ltx2_video", params=pt, data=body, timeout=120), 400,
                          "an audio latent is muxed into output_type=mp4")

    def oip_mp4_with_audio():
        inputs = []
        for name, tensor in (("latent", video_latent), ("audio_latent", ltx2_latent)):
            i = grpcclient.InferInput(name, list(tensor.shape), "FP32")
            i.set_data_from_numpy(np.ascontiguousarray(tensor, dtype=np.float32))
            inputs.append(i)
        result = client.infer("ltx2_video", inputs, outputs=[grpcclient.InferRequestedOutput("sample")],
                              parameters={"output_format": "mp4", "audio_model": "ltx2_audio"})
        files = result.as_numpy("sample")
        assert files.shape == (1,), files.shape
        expect_muxed(bytes(files[0]), 1, ltx2_wave.shape[2], 24000)
        # vaedecode_client: --audio_latent beside --latent, the request option --audio_model.
        out = TMP / "client_av.mp4"
        server.client("--model=ltx2_video", f"--latent={fixture('ltx2_full', 'latent.safetensors')}",
                      f"--audio_latent={fixture('ltx2_audio', 'latent.safetensors')}", "--audio_model=ltx2_audio",
                      f"--out={out}")
        expect_muxed(out.read_bytes(), 1, ltx2_wave.shape[2], 24000)
        expect_oip_error(lambda: client.infer("ltx2_video", inputs, parameters={"output_format": "mp4",
                                                                                "audio_model": "sd"}),
                         "INVALID_ARGUMENT", "audio_model: \"sd\" is not an audio VAE")

    def client_writes_wavs():
        out = TMP / "client.wav"
        server.client("--model=minimax_audio", f"--latent={fixture('minimax_h3_audio', 'latent.safetensors')}",
                      f"--out={out}")
        for b in range(2):
            fmt_tag, channels, rate, samples = parse_wav((TMP / f"client_{b}.wav").read_bytes())
            assert (fmt_tag, channels, str(rate)) == (1, 1, rates["minimax_audio"])
            assert np.abs(samples[:, 0] - np.clip(minimax_wave[b, 0], -1, 1)).max() <= 1 / 32767

    def python_client_npy():
        latent = TMP / "ltx2_latent.npy"
        np.save(latent, ltx2_latent)
        out = TMP / "py_wave.npy"
        script = pathlib.Path(os.environ["TEST_SRCDIR"]) / "vaedecode" / "client" / "python" / "vaedecode_client.py"
        done = subprocess.run(["/usr/bin/python3", str(script), f"--server={server.grpc}", "--model=ltx2_audio",
                               f"--latent={latent}", f"--out={out}"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        got = np.load(out)
        assert got.shape == ltx2_wave.shape and np.abs(got - ltx2_wave).max() <= 1e-4

    for name, fn in (("remote_decode_pt", remote_decode_pt), ("client_writes_wavs", client_writes_wavs),
                     ("python_client_npy", python_client_npy),
                     ("http_pt_waveforms_with_their_rate", http_pt_waveforms_with_their_rate),
                     ("http_wav_files", http_wav_files), ("http_mel_on_request", http_mel_on_request),
                     ("http_refusals", http_refusals), ("oip_waveform_and_rate", oip_waveform_and_rate),
                     ("oip_wav_files", oip_wav_files), ("oip_metadata", oip_metadata),
                     ("oip_refusals", oip_refusals), ("http_mp4_with_audio", http_mp4_with_audio),
                     ("oip_mp4_with_audio", oip_mp4_with_audio)):
        checks.run(name, fn)
    server.stop()
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
