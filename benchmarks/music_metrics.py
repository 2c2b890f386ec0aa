"""Music metrics of the shipped models against real held-out data (valid splits), side by side.

1. pop-piano: N generated pieces of L tokens vs the POP909 valid pieces (each cut to L tokens):
   H1, H4, GS, note density, polyphony, pitch range, and the generated/real ratio.
2. groove: continuations (4 per prompt) of 2-bar prompts taken from every Groove valid piece of at
   least 4 bars; cosine similarity of
   the onset-position × drum-pitch histogram of each quarter of the continuation to the prompt's
   source piece (the SPE paper's groove experiment): the last quarter should stay close to the first.

   Real reference: the same quarters of the pieces' own next bars (where a piece is long enough).
   The last/first ratio comes with a bootstrap 90% interval over prompts.

    python benchmarks/music_metrics.py [--pieces 32] [--length 2048] [--prompts 64] [--bars 16] [--per-prompt 4]
                                       [--only pop-piano|groove] [--groove-model NAME_OR_PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from spemusic.checkpoint import load_model
from spemusic.data import open_dataset
from spemusic.metrics import continuation_similarity, summary
from spemusic.sampling import SamplingOptions, sample

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
KEYS = ("H1", "H4", "GS", "notes_per_bar", "polyphony", "pitch_range")


def cut_to_bars(ids: np.ndarray, tok, max_tokens: int) -> np.ndarray:
    """The first complete bars of a piece within max_tokens (+ EOS)."""
    ids = np.asarray(ids[:max_tokens])
    bars = np.flatnonzero(ids == tok.bar_id)
    if len(bars) > 1:
        ids = ids[: bars[-1]]
    return np.concatenate([ids, [tok.eos_id]])


def mean_metrics(seqs, tok) -> dict:
    rows = [summary(s, tok) for s in seqs]
    return {k: float(np.nanmean([r[k] for r in rows])) for k in KEYS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pieces", type=int, default=32)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--bars", type=int, default=16)
    ap.add_argument("--per-prompt", type=int, default=4, help="continuations per groove prompt (one batch)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--only", choices=("pop-piano", "groove"))
    ap.add_argument("--pop-model", default="pop-piano")
    ap.add_argument("--groove-model", default="groove")
    ap.add_argument("--out", default="benchmarks/results/music_metrics.json")
    args = ap.parse_args()
    opts = SamplingOptions(temperature=1.0, top_p=0.95)
    results = {}
    if args.only != "groove":
        results["pop-piano"] = pop_piano(args, opts)
    if args.only != "pop-piano":
        results["groove"] = groove(args, opts)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


def pop_piano(args, opts) -> dict:
    model, tok = load_model(args.pop_model)
    t0 = time.perf_counter()
    generated = []
    for b in range(0, args.pieces, args.batch):
        generated += sample(model, tok, num=min(args.batch, args.pieces - b), length=args.length, seed=1000 + b,
                            options=opts).ids
    wall = time.perf_counter() - t0
    cache = open_dataset(DATA / "pop909", tok.config)
    real = [cut_to_bars(s, tok, args.length) for s in cache.sequences("valid")]
    gen_m, real_m = mean_metrics(generated, tok), mean_metrics(real, tok)
    print(f"pop-piano: {len(generated)} generated pieces of {args.length} tokens ({wall:.0f} s) "
          f"vs {len(real)} POP909 valid pieces cut to {args.length} tokens")
    print(f"{'metric':<15}{'generated':>11}{'real':>9}{'gen/real':>10}")
    for k in KEYS:
        print(f"{k:<15}{gen_m[k]:>11.3f}{real_m[k]:>9.3f}{gen_m[k] / real_m[k]:>10.2f}")
    return {"generated": gen_m, "real": real_m}


def groove(args, opts) -> dict:
    model, tok = load_model(args.groove_model)
    cache = open_dataset(DATA / "groove", tok.config)
    sources = [np.asarray(s) for s in cache.sequences("valid") if np.count_nonzero(np.asarray(s) == tok.bar_id) >= 4]
    sources = sources[:: max(1, len(sources) // args.prompts)][: args.prompts]
    sims, real = [], []
    t0 = time.perf_counter()
    for i, src in enumerate(sources):
        bars = np.flatnonzero(src == tok.bar_id)
        prompt = src[: bars[2]]  # the first two bars
        outs = sample(model, tok, num=args.per_prompt, bars=args.bars, prompt=prompt, seed=i, options=opts).ids
        # one row per prompt: the mean over its continuations
        sims.append(np.nanmean([continuation_similarity(src, out, tok, prompt_bars=2) for out in outs], axis=0))
        if len(bars) > 2 + args.bars:  # the piece's own next bars, as a reference
            real.append(continuation_similarity(src, src[: bars[2 + args.bars]], tok, prompt_bars=2))
    sims, real = np.array(sims), np.array(real)
    q, qr = np.nanmean(sims, axis=0), np.nanmean(real, axis=0)
    # bootstrap over prompts: how much of the ratio is sampling noise
    rng = np.random.default_rng(0)
    boots = [np.nanmean(s[:, 3]) / np.nanmean(s[:, 0]) for s in (sims[rng.integers(0, len(sims), len(sims))]
                                                                 for _ in range(2000))]
    lo, hi = np.percentile(boots, [5, 95])
    print(f"\ngroove ({args.groove_model}): {args.per_prompt} continuations of {args.bars} bars after each of "
          f"{len(sources)} 2-bar prompts (Groove valid), {time.perf_counter() - t0:.0f} s")
    def quarters(v):
        return "  ".join(f"Q{i + 1} {x:.3f}" for i, x in enumerate(v)) + f"  -> last/first {v[3] / v[0]:.2f}"

    print(f"style similarity to the source, per quarter: {quarters(q)} "
          f"(90% bootstrap interval {lo:.2f}-{hi:.2f}; goal >= 0.8)")
    print(f"real next bars ({len(real)} pieces long enough):  {quarters(qr)}")
    return {"model": str(args.groove_model), "quarters": q.tolist(), "ratio": float(q[3] / q[0]),
            "ratio_90": [float(lo), float(hi)], "real_quarters": qr.tolist(), "per_prompt": sims.tolist()}


if __name__ == "__main__":
    main()
