"""Does each sampling default still earn its place? generate's defaults for a model, then each one
turned off alone, then all of them off (the model alone), on the same seeds: pieces from scratch,
the means of the music metrics and (models with parts) the part metrics, beside the POP909 valid
songs' own (re-barred by their beat annotations, the same number of tokens).

    python benchmarks/sampling_sweep.py [--model pop-piano] [--pieces 16] [--length 2048] [--seed 11]
                                        [--vary follow_repeats=3,10]   # also these values of one option
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from spemusic.generation.sampling import SamplingOptions, sample
from spemusic.music.metrics import part_summary, summary
from spemusic.nn.checkpoint import load_model, read_metadata, resolve
from spemusic.options import SAMPLING_DEFAULTS
from spemusic.training.data import open_dataset

from _errors import run_script  # (benchmarks/, the script's own folder)

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "pop909"
KEYS = ("bars_4_4", "silence", "beats_with_onset", "notes_per_bar", "polyphony", "GS", "key_clarity", "repetition")
LABELS = {"bars_4_4": "4/4 bars", "beats_with_onset": "beat onsets", "notes_per_bar": "notes/bar", "key_clarity": "key",
          "repetition": "repeat", "melody_bars": "mel. bars", "melody_notes_per_bar": "mel. n/bar", "melody_steps": "mel. steps",
          "melody_leaps": "mel. leaps", "bass_fourth_fifth": "bass 4th/5th", "velocity_spread": "vel. spread",
          "melody_entry": "mel. enters", "opening_notes_per_bar": "opening"}
# each sampling option's value that turns it off (the model alone)
OFF = dict(top_p=1.0, bar_top_p=1.0, onset_top_p=1.0, repeat=0.0, hole_penalty=0.0, stacking=1.0, follow_repeats=0.0)
PART_KEYS = ("melody_bars", "melody_notes_per_bar", "melody_steps", "melody_leaps", "bass_fourth_fifth",
             "velocity_spread", "melody_entry", "opening_notes_per_bar")


def cut(ids: np.ndarray, tok, length: int) -> np.ndarray:
    """The first `length` tokens of a song, ended on a bar line."""
    ids = np.asarray(ids[:length])
    bars = np.flatnonzero(ids == tok.bar_id)
    return np.concatenate([ids[: bars[-1]] if len(bars) > 1 else ids, [tok.eos_id]])


def means(seqs, tok) -> dict:
    rows = [{**summary(s, tok), **(part_summary(s, tok) if tok.config.parts else {})} for s in seqs]
    return {k: float(np.nanmean([r[k] for r in rows])) for k in rows[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="pop-piano")
    ap.add_argument("--pieces", type=int, default=16)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--vary", default=None, help="KEY=V1,V2,…: variants with that sampling option at those values")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model, tok = load_model(args.model)
    name = read_metadata(resolve(args.model))["info"].get("name")
    defaults = SamplingOptions.for_model(name)
    knobs = [k for k in SAMPLING_DEFAULTS if getattr(defaults, k) != OFF[k]]
    variants = {"defaults": {}, **{f"no {k}": {k: OFF[k]} for k in knobs},
                "model alone": {k: OFF[k] for k in knobs}}
    if args.vary:
        key, _, values = args.vary.partition("=")
        if key not in SAMPLING_DEFAULTS or not values:
            raise SystemExit(f"--vary: KEY=V1,V2 with KEY one of {', '.join(SAMPLING_DEFAULTS)} (got {args.vary!r})")
        variants.update({f"{key} {float(v):g}": {key: float(v)} for v in values.split(",")})
    keys = KEYS + (PART_KEYS if tok.config.parts else ())
    real = means([cut(s, tok, args.length) for s in open_dataset(
        DATA, tok.config, beats_dir=DATA / "beats", chords_dir=DATA / "chords").sequences("valid")], tok)
    print(f"{args.model}: {args.pieces} pieces of {args.length} tokens from scratch per variant, seed {args.seed}; "
          f"defaults: {', '.join(f'{k} {getattr(defaults, k):g}' for k in knobs)}")
    print(f"{'':<22}" + "".join(f"{LABELS.get(k, k):>13}" for k in keys))
    print(f"{'real songs':<22}" + "".join(f"{real[k]:>13.3f}" for k in keys), flush=True)
    for variant, off in variants.items():
        opts = SamplingOptions.for_model(name, **off)
        res = sample(model, tok, num=args.pieces, length=args.length, seed=args.seed, options=opts)
        got = means(res.ids, tok)
        print(f"{variant:<22}" + "".join(f"{got[k]:>13.3f}" for k in keys), flush=True)


if __name__ == "__main__":
    run_script(main)
