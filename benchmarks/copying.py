"""Does the model copy? Teacher-forced on real songs, its probability for the notes of a bar that
repeat the best-matching earlier bar, against the notes that do not.

Pop repeats itself (the `repetition` of `music_metrics.py`: each bar's best Jaccard overlap of
(pitch, 16th) sets with the 16 bars before it). A model's pieces repeat as much as the songs only
if the model, having seen a pattern, expects it again. Here every Pitch token of the real songs
is classed by its bar's best overlap with an earlier bar and by whether the same (pitch, 16th)
is in that earlier bar: "copyable" notes could be predicted by copying, "new" notes could not. A
model that copies gives the copyable notes a far higher probability than the new ones, the more
so the more the bar repeats; a model that does not treats them alike. The sampler cannot make up
for a model that does not copy: at temperature 1 it reproduces the model's own expectations.

Second, the plainest test of copying: each song's first bars, then its 7th bar played 8 times over,
and the model's probability for the Pitch tokens of each repeat. A model that copies is nearly
sure of the notes from the second repeat on.

Third, how sharp the attention is: on one valid song (1,024 tokens), the exact softmax weights over
each layer's q̂, k̂ (the kernel FAVOR+ estimates), their entropy as a share of the uniform
distribution's (1: attends to everything alike) and the largest weight, at positions 512 on. A
copying head puts most of its weight on one earlier token.

`--exact-softmax` scores with exact softmax attention over the same q̂, k̂ (the kernel FAVOR+
estimates with random features): is the approximation what blurs the copying, or the weights?
`--repeat W` scores the model mixed with the continuous cache that `generate --repeat W` samples
from (spemusic.generation.cache): the copying the network lacks, done outside it.

    python benchmarks/copying.py [--model pop-piano] [--songs 34] [--length 2048] [--repeat W]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from spemusic.generation.cache import mixture_nll
from spemusic.generation.sampling import SamplingOptions
from spemusic.music.metrics import bar_sets, best_earlier_bars, note_grid
from spemusic.nn.checkpoint import load_model
from spemusic.training.data import open_dataset

from _errors import run_script  # (benchmarks/, the script's own folder)

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "pop909"
BUCKETS = [(0.0, 0.2), (0.2, 0.5), (0.5, 0.8), (0.8, 1.01)]


def pitch_targets(s: np.ndarray, tok) -> list[tuple[int, int, int, int]]:
    """(target index, bar, pitch, 16th) of every Pitch token of `s` after the first token."""
    pos_lo, pos_hi = tok.range("Position")
    pitch_lo, pitch_hi = tok.range("Pitch")
    sixteenth = max(tok.config.beat_resolution // 4, 1)
    out, bar, pos = [], -1, 0
    for i, t in enumerate(map(int, s)):
        if t == tok.bar_id:
            bar, pos = bar + 1, 0
        elif pos_lo <= t < pos_hi:
            pos = t - pos_lo
        elif pitch_lo <= t < pitch_hi and i > 0:
            out.append((i - 1, bar, t - pitch_lo, pos // sixteenth))
    return out


def nll_of(model, s: np.ndarray, cache=None) -> np.ndarray:
    """Teacher-forced NLL of tokens 1.. of `s`; `cache` (CacheOptions, token groups): of the model
    mixed with the continuous cache (--repeat)."""
    x, targets = torch.from_numpy(s[None, :-1]), torch.from_numpy(s[1:])
    if cache is not None:
        logits, hidden = model.logits_and_hidden(x)
        return mixture_nll(logits[0], hidden[0], targets, *cache).numpy()
    with torch.no_grad():
        logits = model(x).float()[0]
    return F.cross_entropy(logits, targets, reduction="none").numpy()


def repeated_bar(model, tok, songs, bar: int = 6, repeats: int = 8, cache=None) -> np.ndarray:
    """Per repeat: mean probability of the Pitch tokens and NLL per token, over the songs, of
    bar `bar` of each song played `repeats` times after the bars before it."""
    pitch_lo, pitch_hi = tok.range("Pitch")
    p_sum, p_n, nll_sum, nll_n = (np.zeros(repeats) for _ in range(4))
    for s in songs:
        starts = np.flatnonzero(s == tok.bar_id)
        if len(starts) <= bar + 1:
            continue
        head, one = s[: starts[bar]], s[starts[bar]: starts[bar + 1]]
        seq = np.concatenate([head] + [one] * repeats)
        nll, targets = nll_of(model, seq, cache), seq[1:]
        for r in range(repeats):
            span = slice(len(head) + r * len(one) - 1, len(head) + (r + 1) * len(one) - 1)
            pitch = (targets[span] >= pitch_lo) & (targets[span] < pitch_hi)
            p_sum[r] += np.exp(-nll[span][pitch]).sum()
            p_n[r] += pitch.sum()
            nll_sum[r] += nll[span].sum()
            nll_n[r] += len(nll[span])
    return np.stack([p_sum / p_n, nll_sum / nll_n], axis=1)


def attention_sharpness(model, song: np.ndarray, length: int = 1024) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer, per head: mean entropy of the exact softmax weights over the layer's q̂, k̂ as a
    share of log(context), and mean largest weight, over positions length/2 on."""
    from spemusic.nn.model import Attention

    recorded, qkv = [], Attention._qkv

    def record(self, x, norm, ctx):
        q, k, v = qkv(self, x, norm, ctx)
        recorded.append((q[0], k[0]))
        return q, k, v

    Attention._qkv = record  # read q̂, k̂ as the model makes them
    try:
        with torch.no_grad():
            model(torch.from_numpy(song[None, :length]))
    finally:
        Attention._qkv = qkv
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    late = slice(length // 2, length)
    uniform = torch.log(torch.arange(1, length + 1, dtype=torch.float32))[late]
    rows = []
    for q, k in recorded:
        w = torch.softmax((q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).masked_fill(~causal, float("-inf")), -1)
        entropy = -(w * torch.log(w.clamp_min(1e-30))).sum(-1)[:, late]
        rows.append(((entropy / uniform).mean(-1).numpy(), w.max(-1).values[:, late].mean(-1).numpy()))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="pop-piano")
    ap.add_argument("--songs", type=int, default=34, help="POP909 valid songs (34 in all)")
    ap.add_argument("--length", type=int, default=2048, help="tokens from the start of each song")
    ap.add_argument("--repeats", type=int, default=8, help="times the 7th bar is played in the second test")
    ap.add_argument("--exact-softmax", action="store_true", help="exact softmax in place of FAVOR+, same weights")
    ap.add_argument("--repeat", type=float, default=0.0, help="score the model mixed with the continuous cache "
                    "of this share (generate --repeat; the attention table is the network's own)")
    args = ap.parse_args()
    torch.manual_seed(0)
    model, tok = load_model(args.model)
    model.resample(0)
    opts = SamplingOptions(repeat=args.repeat).cache()
    with_cache = (opts, opts.groups(tok)) if opts is not None else None
    if args.exact_softmax:
        for block in model.blocks:
            block.attn.favor = False
    cache = open_dataset(DATA, tok.config, beats_dir=DATA / "beats", chords_dir=DATA / "chords")
    songs = [np.asarray(s[: args.length + 1], dtype=np.int64) for s in cache.sequences("valid")[: args.songs]]
    rows = []  # (best overlap of the note's bar, copyable, nll)
    t0 = time.perf_counter()
    for s in songs:
        nll = nll_of(model, s, with_cache)
        g = note_grid(s, tok)
        sets = bar_sets(g)
        best = {b: (a, j) for b, a, j in best_earlier_bars(g)}
        for i, bar, pitch, q in pitch_targets(s, tok):
            if bar in best:
                a, j = best[bar]
                rows.append((j, a >= 0 and (pitch, q) in sets[a], nll[i]))
    r = np.array(rows, dtype=np.float64)
    repeat_table = repeated_bar(model, tok, songs, repeats=args.repeats, cache=with_cache)
    sharpness = attention_sharpness(model, songs[0][:1024].copy()) if len(songs[0]) >= 1024 else []
    flag = (" --exact-softmax" if args.exact_softmax else "") + (f" --repeat {args.repeat}" if args.repeat else "")
    print(f"$ python benchmarks/copying.py --model {args.model} --songs {args.songs} --length {args.length}{flag}\n")
    name = (args.model + (" (exact softmax attention)" if args.exact_softmax else "")
            + (f" with the continuous cache (--repeat {args.repeat})" if args.repeat else ""))
    print(f"{name}: {len(songs)} POP909 valid songs (first {args.length} tokens), {len(r):,} notes in "
          f"bars after the first, teacher-forced, fp32 ({time.perf_counter() - t0:.0f} s)\n")
    print("bar's best overlap     notes   copyable   nats/note copyable   new    p copyable   p new   ratio")
    for lo, hi in BUCKETS + [(0.0, 1.01)]:
        m = (r[:, 0] >= lo) & (r[:, 0] < hi)
        cp, new = m & (r[:, 1] == 1), m & (r[:, 1] == 0)
        if not m.any():
            continue
        label = "all bars" if (lo, hi) == (0.0, 1.01) else f"[{lo:.1f}, {min(hi, 1.0):.1f}{']' if hi > 1 else ')'}"
        nc = r[cp, 2].mean() if cp.any() else float("nan")
        nn = r[new, 2].mean() if new.any() else float("nan")
        pc = np.exp(-r[cp, 2]).mean() if cp.any() else float("nan")
        pn = np.exp(-r[new, 2]).mean() if new.any() else float("nan")
        print(f"{label:<20} {m.sum():7,d}   {cp.sum() / m.sum():8.2f}   {nc:9.3f}        {nn:6.3f}   {pc:10.3f}   "
              f"{pn:6.3f}   {pc / pn:5.2f}")
    print("\ncopyable: the (pitch, 16th) is in the bar's best-matching earlier bar (of the 16 before it);"
          "\np: the model's mean probability for the note's Pitch token; ratio: p copyable / p new")
    print(f"\nthe 7th bar of each song played {args.repeats} times after the six before it:")
    print("repeat   p(Pitch)   nats/token")
    for r, (p, n) in enumerate(repeat_table, 1):
        print(f"{r:6d}   {p:8.3f}   {n:10.3f}")
    if sharpness:
        print("\nattention on the first valid song (1,024 tokens, positions 512 on), exact softmax over q̂, k̂:")
        print("layer   entropy / uniform: mean  lowest head   largest weight: mean  highest head")
        for i, (ent, top) in enumerate(sharpness):
            print(f"{i:5d}   {ent.mean():23.2f}  {ent.min():11.2f}   {top.mean():20.3f}  {top.max():12.3f}")


if __name__ == "__main__":
    run_script(main)
