"""Configurations no fixture holds, compared with diffusers itself at test
time: each model is built by diffusers (the pinned venv's) from a fixture's
config with some keys changed, given seeded weights, saved with
save_pretrained, decoded by diffusers and by the real `vaedecode` binary
(dense, and exact over local rank processes), whole tensors compared.

- AutoencoderKL with a mid block without attention and act_fn "swish"
- AutoencoderKLLTX2Video's causal decoder, zero and reflect padding, and
  decoded as a session (chunks of 1 and 2 latent frames)
- AutoencoderKLHunyuanImage and AutoencoderKLHunyuanVideo15 with other
  widths, two resnets per level and upsample_match_channel off (batch 2,
  which diffusers decodes one entry at a time for HunyuanVideo 1.5), and
  HunyuanVideo 1.5's as a session
- AutoencoderKLQwenImage21 in RGB with other widths, levels, statistics
  and temporal flags, 1 resnet a level: decode and encode, batch 2
- AutoencoderKLMiniMaxH3Audio with other BigVGAN rates (one adding a
  sample), widths, AMP kernels and dilations and statistics, batch 2, from
  VAE and raw latents, through the CLI's audio path; its DAC encoder with
  other rates and widths and a 2-head pre_block, on a waveform of no whole
  hops
- AutoencoderKLLTX2Audio with GroupNorm, no causal axis, attention at two
  levels and the mid block, 2 levels and mel_bins null (no vocoder: the mel
  spectrogram), and with the width axis causal, 4 levels (cropped to 4L - 3
  frames) and other statistics, followed by an LTX2Vocoder with
  anti-aliased SnakeBeta, other factors and a clamp: waveform and mel, batch
  2, VAE and packed raw latents; both encoders, moments vs diffusers
- AutoencoderKLMiniMaxH3 with other window geometry (clip_length 16,
  token_drop 2) and no register tokens, and in bfloat16, where diffusers
  keeps the norms and residual scales (so the residual stream) in float32
- encodes: AutoencoderKLWan (Wan 2.1 and 2.2 layouts) with other widths,
  one resnet a level and time halved at other levels, clips of 2 and 3
  chunks, batch 2: moments dense vs diffusers, exact over 3 ranks vs dense;
  AutoencoderKLHunyuanImage's encoder with other widths, 2 resnets a level
  and 3 downsamplers, batch 2; AutoencoderKLHunyuanVideo15's with 8x
  spatial / 2x temporal compression, width-changing resnets, batch 2;
  AutoencoderKLHunyuanVideo's encoder on a 21-frame clip (diffusers'
  temporal windows and their blend) with odd sizes (its downsamplers round
  up), batch 2; AutoencoderKLLTX2Video's encoder with a stride-2 "conv"
  downsampler (rounding rows up), reflect padding and a non-causal encoder
  on an even-length clip, batch 2, and with patch size 2, a block without
  a downsampler and other folding orders; AutoencoderKLMiniMaxH3's encoder
  with replicate padding, 2 resnets a level, 2 norm groups, other factors
  and 9-frame clips (a 13-frame batch of 2 padded to 2 clips, token_drop 1),
  tiling off in diffusers (its default tiles 256-pixel frames)
- structure keys that disagree with the structure (AutoencoderKLWan's
  scale_factor_spatial/temporal, AutoencoderKLHunyuanImage's
  spatial_compression_ratio beyond its levels, AutoencoderKLLTX2Video's
  compression ratios): diffusers decodes them as
  the blocks say, and so must we, warning at load
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import torch
from safetensors.numpy import load_file

RUNFILES = pathlib.Path(os.environ["TEST_SRCDIR"]) / "vaedecode"
sys.path.insert(0, str(RUNFILES / "tests" / "protocols"))
from protocol_harness import TMP, Checks, fixture  # noqa: E402

import diffusers  # noqa: E402

CLI = RUNFILES / "cli" / "vaedecode"
DENSE_TOLERANCE = 1e-4  # vs diffusers, float32
EXACT_TOLERANCE = {4: 1e-5, 5: 3e-5}  # exact vs dense, images / video


def build(name, fixture_name, diffusers_class, overrides, seed):
    """A diffusers model from a fixture's config with `overrides`, every
    parameter that diffusers initialises to a constant (norms, biases,
    residual scales) perturbed so none is the identity."""
    config = json.loads(fixture(fixture_name, "config.json").read_text())
    for key in ("_class_name", "_diffusers_version", "_name_or_path"):
        config.pop(key, None)
    config.update(overrides)
    torch.manual_seed(seed)
    vae = getattr(diffusers, diffusers_class)(**config).eval()
    with torch.no_grad():
        for p in vae.parameters():
            if p.numel() > 0 and float(p.min()) == float(p.max()):
                p.add_(torch.randn_like(p) * 0.1)
    folder = TMP / name
    vae.save_pretrained(str(folder))
    return vae, folder


def reference(vae, latent):
    with torch.no_grad():
        return vae.decode(torch.from_numpy(latent)).sample.float().numpy()


def cli_decode(folder, latent, name, *flags, stderr=None):
    latent_path = TMP / f"{name}_latent.npy"
    np.save(latent_path, latent)
    out = TMP / f"{name}.npy"
    done = subprocess.run([str(CLI), "decode", "--model", str(folder), "--latent", str(latent_path), "--out", str(out),
                           *flags], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"vaedecode decode {' '.join(flags)}: {done.stderr.strip()}"
    if stderr is not None:
        stderr.append(done.stderr)
    return np.load(out), done.stdout


def max_diff(a, b):
    assert a.shape == b.shape, f"shape {a.shape} vs {b.shape}"
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


def cli_encode(folder, image, name, *flags):
    image_path = TMP / f"{name}_image.npy"
    np.save(image_path, image)
    out = TMP / f"{name}.safetensors"
    done = subprocess.run([str(CLI), "encode", "--model", str(folder), "--image", str(image_path), "--out", str(out),
                           "--posterior", "moments", *flags], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"vaedecode encode {' '.join(flags)}: {done.stderr.strip()}"
    got = load_file(str(out))
    return got["mean"], got["logvar"], done.stdout


def check_encode_dense_and_exact(vae, folder, image, name, ranks):
    with torch.no_grad():
        posterior = vae.encode(torch.from_numpy(image)).latent_dist
    want_mean, want_logvar = posterior.mean.numpy(), posterior.logvar.numpy()
    mean, logvar, _ = cli_encode(folder, image, name, "--mode", "dense")
    d = max(max_diff(mean, want_mean), max_diff(logvar, want_logvar))
    assert d <= DENSE_TOLERANCE, f"dense encode vs diffusers: max |diff| {d:.3g} > {DENSE_TOLERANCE}"
    exact_mean, exact_logvar, line = cli_encode(folder, image, f"{name}_exact", "--mode", "exact", "--ranks",
                                                str(ranks), "--timeout-s", "120")
    assert f"mode=exact ranks={ranks}" in line, f"not encoded exactly over {ranks} ranks: {line}"
    e = max(max_diff(exact_mean, mean), max_diff(exact_logvar, logvar))
    tolerance = EXACT_TOLERANCE[image.ndim]
    assert e <= tolerance, f"exact encode over {ranks} ranks vs dense: max |diff| {e:.3g} > {tolerance}"
    print(f"  {name}: dense vs diffusers {d:.3g}, exact vs dense {e:.3g}, mean {list(want_mean.shape)}")


def check_dense_and_exact(vae, folder, latent, name, ranks):
    want = reference(vae, latent)
    dense, _ = cli_decode(folder, latent, name, "--mode", "dense")
    d = max_diff(dense, want)
    assert d <= DENSE_TOLERANCE, f"dense vs diffusers: max |diff| {d:.3g} > {DENSE_TOLERANCE}"
    exact, line = cli_decode(folder, latent, f"{name}_exact", "--mode", "exact", "--ranks", str(ranks),
                             "--timeout-s", "120")
    assert f"mode=exact ranks={ranks}" in line, f"not decoded exactly over {ranks} ranks: {line}"
    e = max_diff(exact, dense)
    tolerance = EXACT_TOLERANCE[latent.ndim]
    assert e <= tolerance, f"exact over {ranks} ranks vs dense: max |diff| {e:.3g} > {tolerance}"
    print(f"  {name}: dense vs diffusers {d:.3g}, exact vs dense {e:.3g}, sample {list(want.shape)}")
    return dense, exact


def check_streams(folder, latent, name, ranks, dense, exact, chunks=None):
    """A streaming session through the CLI (--stream-chunks: the service's
    DecodeSession in one process): `chunks` (default 1, then the rest) equal
    the whole decode, dense bit for bit, exact over `ranks` within 3e-5."""
    chunks = chunks or "1," + str(latent.shape[2] - 1)
    streamed, _ = cli_decode(folder, latent, f"{name}_stream", "--mode", "dense", "--stream-chunks", chunks)
    assert np.array_equal(streamed, dense), f"dense session vs whole: max |diff| {max_diff(streamed, dense):.3g}"
    streamed_exact, line = cli_decode(folder, latent, f"{name}_stream_exact", "--mode", "exact", "--ranks",
                                      str(ranks), "--stream-chunks", chunks, "--timeout-s", "120")
    s = max_diff(streamed_exact, exact)
    assert s <= EXACT_TOLERANCE[5], f"exact session over {ranks} ranks vs whole: max |diff| {s:.3g}"
    print(f"  {name}: sessions of chunks {chunks} dense bit for bit, exact {s:.3g}")


def autoencoder_kl_without_mid_attention():
    vae, folder = build("kl_no_mid_attention", "sd_kl", "AutoencoderKL",
                        {"mid_block_add_attention": False, "act_fn": "swish"}, seed=1)
    latent = np.random.default_rng(1).standard_normal((2, vae.config.latent_channels, 7, 9), dtype=np.float32)
    check_dense_and_exact(vae, folder, latent, "kl_no_mid_attention", ranks=3)


def ltx2_causal(padding):
    def run():
        name = f"ltx2_causal_{padding}"
        vae, folder = build(name, "ltx2", "AutoencoderKLLTX2Video",
                            {"decoder_causal": True, "decoder_spatial_padding_mode": padding}, seed=2)
        latent = np.random.default_rng(2).standard_normal((2, 128, 3, 5, 3), dtype=np.float32)
        dense, exact = check_dense_and_exact(vae, folder, latent, name, ranks=2)
        check_streams(folder, latent, name, 2, dense, exact)
    return run


def hunyuanimage_other_structure():
    # Equal widths: without upsample_match_channel diffusers' resnets cannot change width.
    vae, folder = build("hunyuanimage_structure", "hunyuanimage21", "AutoencoderKLHunyuanImage",
                        {"layers_per_block": 2, "upsample_match_channel": False, "block_out_channels": [32] * 6},
                        seed=4)
    latent = np.random.default_rng(4).standard_normal((2, 16, 5, 3), dtype=np.float32)
    check_dense_and_exact(vae, folder, latent, "hunyuanimage_structure", ranks=3)


def hunyuanvideo15_other_structure_batch_two():
    vae, folder = build("hunyuanvideo15_structure", "hunyuanvideo15", "AutoencoderKLHunyuanVideo15",
                        {"layers_per_block": 2, "upsample_match_channel": False,
                         "block_out_channels": [8, 16, 16, 32, 32]}, seed=5)
    vae.enable_slicing()  # diffusers decodes a batch > 1 only one entry at a time
    latent = np.random.default_rng(5).standard_normal((2, 8, 3, 5, 3), dtype=np.float32)
    dense, exact = check_dense_and_exact(vae, folder, latent, "hunyuanvideo15_structure", ranks=2)
    check_streams(folder, latent, "hunyuanvideo15_structure", 2, dense, exact)


def qwenimage21_other_structure():
    # RGB, 4 levels (8x), 1 resnet a level, time "halved" at levels 0 and 2 (the
    # DupUp3D shortcuts drop their first copies on the single frame), other
    # widths and statistics; decode and encode, batch 2, exact over 3 ranks.
    rng = np.random.default_rng(31)
    vae, folder = build("qwenimage21_structure", "qwenimage21", "AutoencoderKLQwenImage21",
                        {"base_dim": 6, "decoder_base_dim": 8, "dim_mult": [1, 2, 2, 2], "num_res_blocks": 1,
                         "temperal_downsample": [True, False, True], "in_channels": 3, "out_channels": 3,
                         "z_dim": 8, "latents_mean": rng.standard_normal(8).round(3).tolist(),
                         "latents_std": (rng.random(8) + 0.5).round(3).tolist(), "scale_factor_spatial": 8},
                        seed=31)
    latent = rng.standard_normal((2, 8, 1, 5, 3), dtype=np.float32)
    check_dense_and_exact(vae, folder, latent, "qwenimage21_structure", ranks=3)
    image = (rng.random((2, 3, 1, 40, 24), dtype=np.float32) * 2 - 1)
    check_encode_dense_and_exact(vae, folder, image, "qwenimage21_structure_encoder", ranks=3)


def minimax_h3_audio_other_structure():
    # BigVGAN with other rates and widths (an upsampler whose kernel - rate is odd adds a sample),
    # two AMP kernels with other dilations, 16 latent channels with their own statistics; batch
    # 2; from the VAE latent and the raw one, to the waveform, dense (audio is not sharded).
    rng = np.random.default_rng(41)
    vae, folder = build("minimax_audio_structure", "minimax_h3_audio", "AutoencoderKLMiniMaxH3Audio",
                        {"decoder_dim": 16, "decoder_rates": [8, 5, 4, 5], "decoder_kernel_sizes": [16, 10, 8, 9],
                         "resblock_kernel_sizes": [3, 5], "resblock_dilation_sizes": [[1, 2], [1, 3]],
                         "latent_dim": 64, "latent_channels": 16, "num_attention_heads": 2, "encoder_dim": 4,
                         "encoder_rates": [8, 4, 5, 5],
                         "latents_mean": rng.standard_normal(16).round(3).tolist(),
                         "latents_std": (rng.random(16) + 0.5).round(3).tolist(), "sampling_rate": 24000}, seed=41)
    latent = rng.standard_normal((2, 16, 4), dtype=np.float32)
    want = reference(vae, latent)
    got, line = cli_decode(folder, latent, "minimax_audio_structure")
    assert "sample_rate=24000" in line, line
    d = max_diff(got, want)
    assert d <= DENSE_TOLERANCE, f"audio vs diffusers: max |diff| {d:.3g} > {DENSE_TOLERANCE}"
    config = json.loads((folder / "config.json").read_text())
    mean = np.array(config["latents_mean"], dtype=np.float32).reshape(1, 16, 1)
    std = np.array(config["latents_std"], dtype=np.float32).reshape(1, 16, 1)
    raw = ((latent - mean) / std).astype(np.float32)  # what the pipeline de-normalises back
    from_raw, _ = cli_decode(folder, raw, "minimax_audio_structure_raw", "--latent-space", "raw")
    r = max_diff(from_raw, reference(vae, (raw * std + mean).astype(np.float32)))
    assert r <= DENSE_TOLERANCE, f"raw audio vs diffusers: max |diff| {r:.3g}"
    # The encoder: 2 heads, other rates (hop 800 in 4 stages), a waveform that is not whole hops.
    waveform = (rng.random((2, 1, 3001), dtype=np.float32) * 2 - 1)
    with torch.no_grad():
        posterior = vae.encode(torch.from_numpy(waveform)).latent_dist
    mean, logvar, _ = cli_encode(folder, waveform, "minimax_audio_structure_encoder")
    e = max(max_diff(mean, posterior.mean.numpy()), max_diff(logvar, 2 * posterior.logs.numpy()))
    assert e <= DENSE_TOLERANCE, f"audio encode vs diffusers: max |diff| {e:.3g}"
    print(f"  minimax_audio_structure: vs diffusers {d:.3g}, raw {r:.3g}, encode {e:.3g}, "
          f"waveform {list(want.shape)}")


def ltx2_audio_other_structures():
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    def check_encoder(vae, folder, image, name):
        with torch.no_grad():
            posterior = vae.encode(torch.from_numpy(image)).latent_dist
        mean, logvar, line = cli_encode(folder, image, name)
        d = max(max_diff(mean, posterior.mean.numpy()), max_diff(logvar, posterior.logvar.numpy()))
        assert d <= DENSE_TOLERANCE, f"{name}: encode vs diffusers: max |diff| {d:.3g}"
        return d

    rng = np.random.default_rng(59)
    # GroupNorm needs the causal axis "none"; attention where the resolution is 64 and 128.
    vae, folder = build("ltx2_audio_group", "ltx2_audio", "AutoencoderKLLTX2Audio",
                        {"norm_type": "group", "causality_axis": "none", "base_channels": 32, "ch_mult": [1, 2],
                         "num_res_blocks": 1, "attn_resolutions": [64, 128], "resolution": 128,
                         "mid_block_add_attention": True, "latent_channels": 3, "mel_bins": None}, seed=59)
    latent = rng.standard_normal((2, 3, 5, 3), dtype=np.float32)
    want = reference(vae, latent)
    got, line = cli_decode(folder, latent, "ltx2_audio_group")
    assert "output=mel" in line, line
    d = max_diff(got, want)
    assert d <= DENSE_TOLERANCE, f"group-norm mel vs diffusers: max |diff| {d:.3g}"
    e = check_encoder(vae, folder, (rng.random((2, 2, 13, 10), dtype=np.float32) * 2 - 1), "ltx2_audio_group_encoder")
    print(f"  ltx2_audio_group: mel vs diffusers {d:.3g}, encode {e:.3g}, mel {list(want.shape)}")

    # Causal in width, 4 levels (8x frames, cropped to 4L - 3), 12 mel bins, its own statistics;
    # the vocoder anti-aliases SnakeBeta (its filter buffers saved as diffusers makes them).
    vae, folder = build("ltx2_audio_width", "ltx2_audio", "AutoencoderKLLTX2Audio",
                        {"causality_axis": "width", "ch_mult": [1, 2, 2, 2], "base_channels": 6,
                         "latent_channels": 3, "mel_bins": 12}, seed=61)
    features = vae.latents_mean.numel()  # base_channels: 6 = 3 channels x 2 latent mel bins
    with torch.no_grad():
        vae.latents_mean.copy_(torch.from_numpy(rng.standard_normal(features, dtype=np.float32)))
        vae.latents_std.copy_(torch.from_numpy(rng.random(features, dtype=np.float32) + 0.5))
    vae.save_pretrained(str(folder))
    torch.manual_seed(67)
    vocoder = LTX2Vocoder(in_channels=24, hidden_channels=16, upsample_kernel_sizes=[8, 6, 4],
                          upsample_factors=[4, 3, 2], resnet_kernel_sizes=[3, 5], resnet_dilations=[[1, 2], [1, 3]],
                          act_fn="snakebeta", antialias=True, antialias_kernel_size=8, final_act_fn="clamp",
                          output_sampling_rate=16000).eval()
    with torch.no_grad():
        for p in vocoder.parameters():
            if float(p.min()) == float(p.max()):
                p.add_(torch.randn_like(p) * 0.1)
    vocoder.save_pretrained(str(folder / "vocoder"))
    latent = rng.standard_normal((2, 3, 4, 2), dtype=np.float32)
    with torch.no_grad():
        mel = vae.decode(torch.from_numpy(latent)).sample
        want = vocoder(mel).numpy()
    got, line = cli_decode(folder, latent, "ltx2_audio_width")
    assert "output=waveform sample_rate=16000" in line, line
    d = max_diff(got, want)
    assert d <= DENSE_TOLERANCE, f"waveform vs diffusers: max |diff| {d:.3g}"
    got_mel, _ = cli_decode(folder, latent, "ltx2_audio_width_mel", "--audio-output", "mel")
    m = max_diff(got_mel, mel.numpy())
    assert m <= DENSE_TOLERANCE, f"mel vs diffusers: max |diff| {m:.3g}"
    mean, std = vae.latents_mean.numpy(), vae.latents_std.numpy()
    packed = latent.transpose(0, 2, 1, 3).reshape(2, 4, features)  # _pack_audio_latents
    raw = ((packed - mean) / std).astype(np.float32)  # what the pipeline de-normalises back
    from_raw, _ = cli_decode(folder, raw, "ltx2_audio_width_raw", "--latent-space", "raw")
    unpacked = (raw * std + mean).astype(np.float32).reshape(2, 4, 3, 2).transpose(0, 2, 1, 3)
    with torch.no_grad():
        want_raw = vocoder(vae.decode(torch.from_numpy(np.ascontiguousarray(unpacked))).sample).numpy()
    r = max_diff(from_raw, want_raw)
    assert r <= DENSE_TOLERANCE, f"raw waveform vs diffusers: max |diff| {r:.3g}"
    e = check_encoder(vae, folder, (rng.random((2, 2, 19, 12), dtype=np.float32) * 2 - 1), "ltx2_audio_width_encoder")
    print(f"  ltx2_audio_width: waveform vs diffusers {d:.3g}, mel {m:.3g}, raw {r:.3g}, encode {e:.3g}, "
          f"waveform {list(want.shape)}")


def minimax_h3_other_windows():
    # Windows of 6 latent frames every 4, no pre-padding, 8 frames faded: 11
    # latent frames make 3 windows from a clip padded by 3. The session's
    # chunks return nothing, then the first window (its latents all came),
    # then the rest at the clip's end.
    vae, folder = build("minimax_windows", "minimax_h3", "AutoencoderKLMiniMaxH3",
                        {"clip_length": 16, "token_drop": 2, "decoder_num_register_tokens": 0}, seed=3)
    vae.disable_tiling()  # vaedecode decodes MiniMax-H3 untiled (its decode_note)
    latent = np.random.default_rng(3).standard_normal((2, 24, 11, 5, 2), dtype=np.float32)
    dense, exact = check_dense_and_exact(vae, folder, latent, "minimax_windows", ranks=2)
    check_streams(folder, latent, "minimax_windows", 2, dense, exact, chunks="1,6,4")


def disagreeing_structure_key(name, fixture_name, diffusers_class, overrides, shape, warning):
    def run():
        vae, folder = build(name, fixture_name, diffusers_class, overrides, seed=6)
        latent = np.random.default_rng(6).standard_normal(shape, dtype=np.float32)
        stderr = []
        cli_decode(folder, latent, f"{name}_warned", "--mode", "dense", stderr=stderr)
        assert warning in stderr[0], f"no warning naming {warning!r}: {stderr[0]!r}"
        check_dense_and_exact(vae, folder, latent, name, ranks=2)
    return run


def minimax_h3_bfloat16():
    folder = fixture("minimax_h3")
    latent = next(iter(load_file(str(fixture("minimax_h3", "latent.safetensors"))).values())).astype(np.float32)
    mixed = diffusers.AutoencoderKLMiniMaxH3.from_pretrained(str(folder), torch_dtype=torch.bfloat16).eval()
    mixed.disable_tiling()
    assert mixed.decoder.transformer_blocks[0].norm1.weight.dtype == torch.float32, "diffusers kept nothing in float32"
    want = reference(mixed, latent)
    ours, line = cli_decode(folder, latent, "minimax_bf16", "--mode", "dense", "--dtype", "bf16")
    assert "dtype=bfloat16" in line, line
    # The whole decoder in bfloat16 (a bfloat16 residual stream): where a
    # decode that ignored _keep_in_fp32_modules lands. bfloat16 roundings
    # turn the float32 kernels' last-bit differences into whole-ulp ones in
    # a large share of the output, so the measure is the mean distance:
    # ours must sit well inside the all-bfloat16 decode's.
    plain = diffusers.AutoencoderKLMiniMaxH3.from_pretrained(str(folder)).eval().to(torch.bfloat16)
    plain.disable_tiling()
    ours_mean = float(np.abs(ours - want).mean())
    plain_mean = float(np.abs(reference(plain, latent) - want).mean())
    print(f"  minimax bf16: mean |diff| vs diffusers' mixed precision {ours_mean:.3g}, all-bf16's {plain_mean:.3g}")
    assert plain_mean > 0.0, "the all-bfloat16 decode equals the mixed one: the check cannot tell them apart"
    assert ours_mean <= 0.6 * plain_mean, (
        f"bf16 decode vs diffusers' mixed precision: mean |diff| {ours_mean:.3g}, not well below the "
        f"all-bfloat16 decode's {plain_mean:.3g}")


def wan_encoders():
    # Wan 2.1's flat encoder: 6 wide, 1 resnet a level, time halved at levels 0 and 1.
    vae, folder = build("wan21_encoder", "wan21", "AutoencoderKLWan",
                        {"base_dim": 6, "num_res_blocks": 1, "dim_mult": [1, 2, 2, 3],
                         "temperal_downsample": [True, True, False]}, seed=23)
    image = (np.random.default_rng(5).random((2, 3, 9, 40, 24), dtype=np.float32) * 2 - 1)
    check_encode_dense_and_exact(vae, folder, image, "wan21_encoder", ranks=3)
    # Wan 2.2's residual down blocks (AvgDown3D shortcuts), time halved at levels 0 and 2.
    vae, folder = build("wan22_encoder", "wan22", "AutoencoderKLWan",
                        {"base_dim": 4, "num_res_blocks": 1, "dim_mult": [1, 2, 2, 2],
                         "temperal_downsample": [True, False, True]}, seed=29)
    image = (np.random.default_rng(6).random((1, 3, 5, 48, 32), dtype=np.float32) * 2 - 1)
    check_encode_dense_and_exact(vae, folder, image, "wan22_encoder", ranks=3)


def hunyuanimage_encoder():
    vae, folder = build("hunyuanimage_encoder", "hunyuanimage21", "AutoencoderKLHunyuanImage",
                        {"block_out_channels": [32, 64, 64, 64], "layers_per_block": 2,
                         "spatial_compression_ratio": 8}, seed=31)
    image = (np.random.default_rng(7).random((2, 3, 40, 24), dtype=np.float32) * 2 - 1)
    check_encode_dense_and_exact(vae, folder, image, "hunyuanimage_encoder", ranks=3)


def hunyuanvideo15_encoder():
    vae, folder = build("hunyuanvideo15_encoder", "hunyuanvideo15", "AutoencoderKLHunyuanVideo15",
                        {"block_out_channels": [16, 32, 32, 64], "layers_per_block": 2,
                         "spatial_compression_ratio": 8, "temporal_compression_ratio": 2}, seed=37)
    image = (np.random.default_rng(8).random((2, 3, 5, 32, 24), dtype=np.float32) * 2 - 1)
    # diffusers' frame-causal attention mask does not broadcast over a batch
    # of 2: its reference encodes one entry at a time (batch entries are
    # independent; vaedecode encodes the batch at once).
    vae.enable_slicing()
    check_encode_dense_and_exact(vae, folder, image, "hunyuanvideo15_encoder", ranks=3)


def hunyuanvideo_encoder_temporal_windows():
    vae, folder = build("hunyuanvideo_encoder", "hunyuanvideo", "AutoencoderKLHunyuanVideo",
                        {"layers_per_block": 1}, seed=41)
    image = (np.random.default_rng(9).random((2, 3, 21, 41, 26), dtype=np.float32) * 2 - 1)
    check_encode_dense_and_exact(vae, folder, image, "hunyuanvideo_encoder", ranks=3)


def ltx2_encoders():
    # A "conv" downsampler first (it keeps 128 channels and rounds 23 rows up
    # to 12, 10 frames up to 5), reflect padding, not causal: 92x64 -> 3x2.
    vae, folder = build("ltx2_encoder_conv", "ltx2_full", "AutoencoderKLLTX2Video",
                        {"downsample_type": ["conv", "spatial", "temporal", "spatiotemporal"],
                         "block_out_channels": [128, 16, 32, 32], "layers_per_block": [1, 1, 0, 1, 2],
                         "encoder_spatial_padding_mode": "reflect", "encoder_causal": False}, seed=43)
    image = (np.random.default_rng(10).random((2, 3, 10, 92, 64), dtype=np.float32) * 2 - 1)
    check_encode_dense_and_exact(vae, folder, image, "ltx2_encoder_conv", ranks=3)
    # Patch size 2, block 2 without a downsampler: 16x spatial, 4x temporal.
    vae, folder = build("ltx2_encoder_patch2", "ltx2_full", "AutoencoderKLLTX2Video",
                        {"patch_size": 2, "block_out_channels": [16, 32, 32, 64], "layers_per_block": [1, 2, 1, 0, 1],
                         "downsample_type": ["spatiotemporal", "spatial", "temporal", "spatiotemporal"],
                         "spatio_temporal_scaling": [True, True, False, True],
                         "spatial_compression_ratio": None, "temporal_compression_ratio": None}, seed=47)
    image = (np.random.default_rng(11).random((1, 3, 9, 80, 48), dtype=np.float32) * 2 - 1)
    check_encode_dense_and_exact(vae, folder, image, "ltx2_encoder_patch2", ranks=3)


def minimax_h3_encoder():
    vae, folder = build("minimax_encoder", "minimax_h3", "AutoencoderKLMiniMaxH3",
                        {"block_out_channels": [8, 16, 16, 32], "layers_per_block": 2, "norm_num_groups": 2,
                         "spatial_downsample_factors": [2, 2, 2, 1], "temporal_downsample_factors": [2, 1, 2, 1],
                         "clip_length": 9, "token_drop": 1, "spatial_padding_mode": "replicate"}, seed=53)
    vae.disable_tiling()
    image = (np.random.default_rng(12).random((2, 3, 13, 40, 24), dtype=np.float32) * 2 - 1)
    check_encode_dense_and_exact(vae, folder, image, "minimax_encoder", ranks=3)


def main():
    torch.set_num_threads(2)
    checks = Checks("diffusers_variants")
    checks.run("autoencoder_kl_mid_block_without_attention_swish", autoencoder_kl_without_mid_attention)
    checks.run("ltx2_causal_zero_padding", ltx2_causal("zeros"))
    checks.run("ltx2_causal_reflect_padding", ltx2_causal("reflect"))
    checks.run("hunyuanimage21_other_structure", hunyuanimage_other_structure)
    checks.run("hunyuanvideo15_other_structure_batch_two", hunyuanvideo15_other_structure_batch_two)
    checks.run("qwenimage21_other_structure_rgb", qwenimage21_other_structure)
    checks.run("minimax_h3_audio_other_structure", minimax_h3_audio_other_structure)
    checks.run("ltx2_audio_other_structures_with_a_snake_vocoder", ltx2_audio_other_structures)
    checks.run("minimax_h3_other_windows_no_registers", minimax_h3_other_windows)
    checks.run("minimax_h3_bfloat16_mixed_precision", minimax_h3_bfloat16)
    checks.run("wan_encoders_other_structure", wan_encoders)
    checks.run("hunyuanimage_encoder_other_structure", hunyuanimage_encoder)
    checks.run("hunyuanvideo15_encoder_other_structure", hunyuanvideo15_encoder)
    checks.run("hunyuanvideo_encoder_temporal_windows_odd_sizes", hunyuanvideo_encoder_temporal_windows)
    checks.run("ltx2_encoders_other_structure", ltx2_encoders)
    checks.run("minimax_h3_encoder_other_structure", minimax_h3_encoder)
    checks.run("wan21_scale_factors_disagreeing_with_the_blocks",
               disagreeing_structure_key("wan_scale_factors", "wan21", "AutoencoderKLWan",
                                         {"scale_factor_spatial": 16, "scale_factor_temporal": 2}, (1, 16, 3, 4, 5),
                                         "scale_factor_spatial is 16 but the decoder's blocks upsample 8x"))
    checks.run("hunyuanimage21_compression_ratio_beyond_its_levels",
               disagreeing_structure_key("hunyuanimage_ratio", "hunyuanimage21", "AutoencoderKLHunyuanImage",
                                         {"spatial_compression_ratio": 64}, (1, 16, 3, 5),
                                         "spatial_compression_ratio is 64 but"))
    checks.run("ltx2_compression_ratios_disagreeing_with_the_blocks",
               disagreeing_structure_key("ltx2_ratios", "ltx2", "AutoencoderKLLTX2Video",
                                         {"spatial_compression_ratio": 16, "temporal_compression_ratio": 4},
                                         (1, 128, 2, 2, 3),
                                         "spatial_compression_ratio is 16 but the decoder's blocks upsample 32x"))
    sys.exit(checks.finish())


if __name__ == "__main__":
    main()
