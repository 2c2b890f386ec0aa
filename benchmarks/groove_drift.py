"""What groove continuations lose against their prompt's piece, drum by drum and grid by grid.

For 2-bar prompts of the Groove valid pieces, the continuations' style similarity (the cosine of
onset-position × drum-pitch histograms, as in music_metrics.py) is recomputed with the time and
the drums coarsened one at a time, beside the same figures for the pieces' own next bars:
- exact: 12 steps per beat × the exact GM pitch (music_metrics' measure);
- 16ths: onsets rounded to the sixteenth note (a drummer's micro-timing removed);
- kit: pitches merged into kit pieces (kick, snare, hi-hat, ride, crash, toms, other);
- 16ths+kit: both.
Then, per kit piece, onsets per bar in the prompt's piece and in the continuation, and each
piece's own similarity (16ths): which drums drift, and whether fills appear where the prompt had none.

    python benchmarks/groove_drift.py [--model groove] [--prompts 24] [--per-prompt 2] [--bars 16]
                                      [--top-p 0.95] [--temperature 1.0] [--repeat 0]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from spemusic.generation.sampling import SamplingOptions, sample
from spemusic.music.metrics import cosine, note_grid
from spemusic.nn.checkpoint import load_model
from spemusic.training.data import open_dataset

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
KIT = {"kick": (35, 36), "snare": (37, 38, 40, 39), "hi-hat": (42, 44, 46, 22, 26), "ride": (51, 53, 59),
       "crash": (49, 52, 55, 57), "toms": (41, 43, 45, 47, 48, 50, 58)}
PIECE_OF = np.full(128, len(KIT), dtype=int)
for k, pitches in enumerate(KIT.values()):
    PIECE_OF[list(pitches)] = k
NAMES = [*KIT, "other"]
VIEWS = ("exact", "16ths", "kit", "16ths+kit")


def histogram(g, sel, view: str) -> np.ndarray:
    pos, pitch = g.pos[sel & g.drum], g.pitch[sel & g.drum]
    if "16ths" in view:
        pos = np.rint(pos / (g.res / 4)).astype(int)  # 4 sixteenths per beat
    if "kit" in view:
        pitch = PIECE_OF[pitch]
    h = np.zeros((97, 128))
    np.add.at(h, (np.minimum(pos, 96), pitch), 1)
    return h.ravel()


def quarters_of(g, prompt_bars: int):
    new = g.n_bars - prompt_bars
    if new < 4:
        return None
    edges = prompt_bars + np.linspace(0, new, 5).round().astype(int)
    return [(g.bar >= edges[i]) & (g.bar < edges[i + 1]) for i in range(4)]


def measure(src_grid, cont_grid) -> dict | None:
    qs = quarters_of(cont_grid, 2)
    if qs is None:
        return None
    everything = np.ones(len(src_grid.pitch), dtype=bool)
    out = {v: [cosine(histogram(src_grid, everything, v), histogram(cont_grid, q, v)) for q in qs] for v in VIEWS}
    new = cont_grid.bar >= 2
    bars = max(cont_grid.n_bars - 2, 1)
    for k, name in enumerate(NAMES):
        piece_src = everything & (PIECE_OF[src_grid.pitch] == k) & src_grid.drum
        piece_new = new & (PIECE_OF[cont_grid.pitch] == k) & cont_grid.drum
        out[f"{name} per bar"] = (piece_src.sum() / max(src_grid.n_bars, 1), piece_new.sum() / bars)
        out[f"{name} sim"] = cosine(histogram(src_grid, piece_src, "16ths"), histogram(cont_grid, piece_new, "16ths"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="groove")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--per-prompt", type=int, default=2)
    ap.add_argument("--bars", type=int, default=16)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeat", type=float, default=0.0, help="the continuous cache's share (generate --repeat)")
    args = ap.parse_args()
    model, tok = load_model(args.model)
    cache = open_dataset(DATA / "groove", tok.config)
    sources = [np.asarray(s) for s in cache.sequences("valid")
               if np.count_nonzero(np.asarray(s) == tok.bar_id) >= 2 + args.bars + 1]
    sources = sources[:: max(1, len(sources) // args.prompts)][: args.prompts]
    opts = SamplingOptions(top_p=args.top_p, bar_top_p=args.top_p, temperature=args.temperature, repeat=args.repeat)
    gen, real = [], []
    for i, src in enumerate(sources):
        bars = np.flatnonzero(src == tok.bar_id)
        g_src = note_grid(src, tok)
        for out in sample(model, tok, num=args.per_prompt, bars=args.bars, prompt=src[: bars[2]], seed=i,
                          options=opts).ids:
            m = measure(g_src, note_grid(out, tok))
            if m:
                gen.append(m)
        m = measure(g_src, note_grid(src[: bars[2 + args.bars]], tok))
        if m:
            real.append(m)
    print(f"{args.model}: {len(sources)} Groove valid prompts of 2 bars, {args.per_prompt} continuations of "
          f"{args.bars} bars each, top-p {args.top_p}, temperature {args.temperature}, repeat {args.repeat}; "
          "real: the pieces' next bars")
    print(f"{'similarity (Q1..Q4)':<22}{'generated':>30}{'real':>30}{'ratio Q1':>10}")
    for v in VIEWS:
        a, b = np.nanmean([m[v] for m in gen], axis=0), np.nanmean([m[v] for m in real], axis=0)
        print(f"{v:<22}{' '.join(f'{x:.3f}' for x in a):>30}{' '.join(f'{x:.3f}' for x in b):>30}{a[0] / b[0]:>10.2f}")
    print(f"\n{'kit piece':<10}{'onsets/bar: piece':>18}{'generated':>11}{'real next':>11}"
          f"{'sim 16ths: generated':>22}{'real next':>11}")
    for name in NAMES:
        src_rate = np.mean([m[f"{name} per bar"][0] for m in real])
        g_rate = np.mean([m[f"{name} per bar"][1] for m in gen])
        r_rate = np.mean([m[f"{name} per bar"][1] for m in real])
        if not (src_rate or g_rate or r_rate):
            continue
        gs, rs = np.nanmean([m[f"{name} sim"] for m in gen]), np.nanmean([m[f"{name} sim"] for m in real])
        print(f"{name:<10}{src_rate:>18.2f}{g_rate:>11.2f}{r_rate:>11.2f}{gs:>22.3f}{rs:>11.3f}")


if __name__ == "__main__":
    main()
