#!/usr/bin/python3
"""Draws bench/peers' table as a chart: decode time per configuration, peers and vaedecode apart.

Debian's matplotlib (python3-matplotlib; bench/peers/run.sh installs it), reading the JSON that
peers_bench.py --json writes.

    /usr/bin/python3 bench/peers/chart.py RESULTS.json OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLOURS = {"diffusers": "#8c8c8c", "distvae": "#c98b2b", "vaedecode": "#2b6cb0"}


def main():
    results_path, png_path = sys.argv[1], sys.argv[2]
    with open(results_path) as f:
        results = json.load(f)
    rows = results["rows"]
    names = [r["name"] for r in rows]
    seconds = [r["decode_ms"] / 1e3 for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(rows) + 1.4))
    bars = ax.barh(range(len(rows)), seconds, color=[COLOURS.get(r["peer"], "#444444") for r in rows])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    for bar, r in zip(bars, rows):
        label = f"{r['decode_ms'] / 1e3:.2f} s  {r['ratio']:.2f}x"
        if r["collectives"]:
            label += f"  {r['collectives']} collectives"
        if r["max_abs_error"] > 0:
            label += f"  err {r['max_abs_error']:.0e}"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + label, va="center", fontsize=7)
    ax.set_xlim(0, max(seconds) * 1.6)
    ax.set_xlabel("decode seconds (median); ratio = speed vs diffusers dense 1 thread")
    ax.set_title(f"{results['shape']} latent, half-width SD AutoencoderKL, {results['rounds']} interleaved rounds",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


if __name__ == "__main__":
    main()
