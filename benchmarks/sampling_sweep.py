"""Sampling settings against the music metrics: pieces from scratch with each (temperature, top-p,
bar top-p), the means of the metrics that music_metrics.py checks, and the real songs' values.

    python benchmarks/sampling_sweep.py [--model pop-piano] [--pieces 16] [--length 2048]
                                        [--variants 1,0.95,0.95 1,1,0.8 ...]

A variant is temperature,top_p,bar_top_p. The defaults of `generate` are the first one.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from spemusic.checkpoint import load_model
from spemusic.cli import SAMPLING_DEFAULTS
from spemusic.metrics import summary
from spemusic.sampling import SamplingOptions, sample

from _errors import run_script  # (benchmarks/, the script's own folder)

KEYS = ("bars_4_4", "silence", "beats_with_onset", "notes_per_bar", "polyphony", "H1", "key_clarity", "repetition")
REAL = {"bars_4_4": 0.927, "silence": 0.024, "beats_with_onset": 0.965, "notes_per_bar": 17.900, "polyphony": 1.871,
        "H1": 2.112, "key_clarity": 0.874, "repetition": 0.307}  # POP909 valid, music_metrics_pop_v2.txt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="pop-piano")
    ap.add_argument("--pieces", type=int, default=16)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--variants", nargs="+",
                    default=[f"1,{SAMPLING_DEFAULTS['top_p']},{SAMPLING_DEFAULTS['bar_top_p']}", "1,0.95,0.95",
                             "1,0.98,0.98", "0.9,0.95,0.95", "1,1,1", "1,1,0.95", "1,0.99,0.9"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = load_model(args.model)
    print(f"{args.model}: {args.pieces} pieces of {args.length} tokens from scratch per variant, seed {args.seed}")
    print(f"{'T,top-p,bar':<16}" + "".join(f"{k[:10]:>11}" for k in KEYS))
    print(f"{'real songs':<16}" + "".join(f"{REAL[k]:>11.3f}" for k in KEYS), flush=True)
    for variant in args.variants:
        t, p, bar = map(float, variant.split(","))
        opts = SamplingOptions(temperature=t, top_p=p, bar_top_p=bar)
        res = sample(model, tok, num=args.pieces, length=args.length, seed=args.seed, options=opts)
        rows = [summary(ids, tok) for ids in res.ids]
        print(f"{variant:<16}" + "".join(f"{float(np.nanmean([r[k] for r in rows])):>11.3f}" for k in KEYS),
              flush=True)


if __name__ == "__main__":
    run_script(main)
