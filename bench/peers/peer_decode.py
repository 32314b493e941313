"""One peer decode in its own process: diffusers (dense or tiled) or one rank of DistVAE.

bench/peers/peers_bench.py runs this with the pinned venv's python (tools/python_env.sh), once per
configuration and round, so each decode gets a fresh process (its peak RSS is its own) and its own
thread count. It loads the model folder the harness wrote (diffusers' save_pretrained), the latent
(.npy), decodes under torch.inference_mode, writes the output (.npy, float32) and prints one JSON
line: decode_ms (the decode alone; DistVAE: from a barrier to the gathered output), collectives
(DistVAE: calls into torch.distributed during the decode) and tiles (diffusers tiled).

    peer_decode.py diffusers --model DIR --latent z.npy --out out.npy --threads 1 [--tile-latent 32]
    peer_decode.py distvae --model DIR --latent z.npy --out out.npy --threads 1   (RANK, WORLD_SIZE,
        MASTER_ADDR, MASTER_PORT in the environment, as torchrun sets them)
    peer_decode.py write-model --model DIR --widths 64,128,256,256 --seed 0   (the benchmark's model:
        an SD-shaped AutoencoderKL with seeded weights, saved by diffusers; prints the versions)
"""
import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist


def load(model, dtype):
    from diffusers import AutoencoderKL

    return AutoencoderKL.from_pretrained(model, torch_dtype=dtype).eval()


class CollectiveCounter:
    """Counts the torch.distributed calls DistVAE makes (patched on the module it calls through)."""

    # Not isend/irecv: P2POp checks their identity; DistVAE batches them in batch_isend_irecv.
    NAMES = ("all_gather", "all_gather_object", "all_reduce", "batch_isend_irecv", "broadcast",
             "all_gather_into_tensor", "reduce_scatter", "send", "recv")

    def __init__(self):
        self.counts = {}
        self.active = False
        for name in self.NAMES:
            original = getattr(dist, name, None)
            if original is not None:
                setattr(dist, name, self._wrap(name, original))

    def _wrap(self, name, original):
        def counted(*args, **kwargs):
            if self.active:
                self.counts[name] = self.counts.get(name, 0) + 1
            return original(*args, **kwargs)

        return counted


def write_model(folder, widths, seed):
    import diffusers
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    blocks = len(widths)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=tuple(widths),
        down_block_types=("DownEncoderBlock2D",) * blocks, up_block_types=("UpDecoderBlock2D",) * blocks,
        layers_per_block=2, norm_num_groups=32, sample_size=512)
    vae.save_pretrained(folder, safe_serialization=True)
    from importlib.metadata import version

    print(f"torch {torch.__version__}, diffusers {diffusers.__version__}, distvae {version('distvae')}")


def tiles_of(vae, latent):
    """How many tiles diffusers' tiled_decode cuts this latent into (its own loop bounds)."""
    if not (latent.shape[-1] > vae.tile_latent_min_size or latent.shape[-2] > vae.tile_latent_min_size):
        return 1
    step = int(vae.tile_latent_min_size * (1 - vae.tile_overlap_factor))
    return len(range(0, latent.shape[-2], step)) * len(range(0, latent.shape[-1], step))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("peer", choices=["diffusers", "distvae", "write-model"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--latent", default="")
    ap.add_argument("--widths", default="64,128,256,256")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--tile-latent", type=int, default=0, help="diffusers tiled: tile_latent_min_size")
    args = ap.parse_args()

    if args.peer == "write-model":
        write_model(args.model, [int(w) for w in args.widths.split(",")], args.seed)
        return
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    vae = load(args.model, dtype)
    latent = torch.from_numpy(np.load(args.latent)).to(dtype)
    report = {"peer": args.peer, "threads": args.threads, "dtype": args.dtype}

    if args.peer == "diffusers":
        if args.tile_latent:
            vae.enable_tiling()
            vae.tile_latent_min_size = args.tile_latent
            vae.tile_sample_min_size = args.tile_latent * 2 ** (len(vae.config.block_out_channels) - 1)
            report["tiles"] = tiles_of(vae, latent)
        with torch.inference_mode():
            start = time.perf_counter()
            sample = vae.decode(latent).sample
            report["decode_ms"] = (time.perf_counter() - start) * 1e3
    else:
        counter = CollectiveCounter()  # before DistVAE is imported, so its calls go through it
        from distvae.modules.adapters.vae.decoder_adapters import DecoderAdapter

        dist.init_process_group("gloo")
        vae.decoder = DecoderAdapter(vae.decoder)
        with torch.inference_mode():
            dist.barrier()
            counter.active = True
            start = time.perf_counter()
            sample = vae.decode(latent).sample
            report["decode_ms"] = (time.perf_counter() - start) * 1e3
            counter.active = False
        report["rank"] = dist.get_rank()
        report["collectives"] = sum(counter.counts.values())
        report["collectives_by_kind"] = counter.counts
        dist.barrier()
        dist.destroy_process_group()
        if report["rank"] != 0:
            args.out = ""
    if args.out:
        np.save(args.out, sample.float().numpy())
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
