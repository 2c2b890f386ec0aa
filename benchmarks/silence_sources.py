"""Where the holes come from: silence in generated pieces split by its cause, next to real songs,
and the model's own time decisions measured against what real songs do.

1. Silence (time with no note sounding, from the first onset to the end of the last note) split
   by the gap it lies in: gaps of at most one beat between two onsets (the notes were too short
   for the rhythm) and gaps of more than one beat (the model chose a long rest), with the share of
   onsets followed by such a gap and the mean note duration.
2. The decision after each note, teacher-forced on the real songs: another note at the same onset,
   the next onset within one beat, more than one beat later in the same bar, or the bar line
   early (more than a beat before its end) -- the model's mean probability of each against how
   often the songs take it. A calibrated model matches the songs; the same figures on the model's
   own pieces show whether sampling drifts from there. Also the probability the grammar mask
   removes there (the sampler renormalises what is left). The notes are sampled with the
   defaults of `generate` (top-p 1 after a note: no nucleus there to cut the tail).
3. Clusters: after the k-th note of an onset, the model's probability of one more note against
   the songs', and the probability it gives to a Position at or before the current one (a model
   that knows where it stands gives none): the model sees the onset's Position token through its
   short convolution (4 tokens, one note) and must find it by attention beyond; and the share
   of onsets with 5 or more notes.

    python benchmarks/silence_sources.py [--model pop-piano] [--pieces 16] [--length 2048]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from spemusic.generation.sampling import SamplingOptions, sample
from spemusic.music.metrics import note_grid, sounding
from spemusic.nn.checkpoint import load_model
from spemusic.tokens.grammar import GrammarState, REMIGrammar
from spemusic.training.data import open_dataset

from _errors import run_script  # (benchmarks/, the script's own folder)

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
BEAT = 12  # grid steps per beat (the tokenizer's beat_resolution, checked below)


def silence_split(seqs, tok) -> dict:
    steps = short = long_ = onsets = long_onsets = 0
    durations = []
    for s in seqs:
        g = note_grid(s, tok)
        if not len(g.onset):
            continue
        on = sounding(g)
        lo, hi = int(g.onset.min()), int(min((g.onset + np.maximum(g.dur, 1)).max(), len(on)))
        t = np.arange(lo, hi)
        silent = ~on[lo:hi]
        starts = np.unique(g.onset)
        i = np.searchsorted(starts, t, side="right")
        gap = np.where(i < len(starts), starts[np.minimum(i, len(starts) - 1)], hi) - starts[i - 1]
        steps += len(t)
        short += int((silent & (gap <= BEAT)).sum())
        long_ += int((silent & (gap > BEAT)).sum())
        onsets += len(starts) - 1
        long_onsets += int((np.diff(starts) > BEAT).sum())
        durations.append(g.dur)
    return {"silence": (short + long_) / steps, "in gaps <= 1 beat": short / steps, "in gaps > 1 beat": long_ / steps,
            "onsets followed by > 1 beat": long_onsets / onsets,
            "mean note duration (beats)": float(np.concatenate(durations).mean()) / BEAT}


DECISIONS = ("another note, same onset", "next onset within 1 beat", "next onset > 1 beat, same bar",
             "bar line > 1 beat before its end")


@torch.inference_mode()
def next_token_probs(model, seqs) -> list[np.ndarray]:
    """Teacher-forced next-token probabilities (T-1, V) of each sequence: computed once, read by
    both `decisions` and `stacking`."""
    return [torch.softmax(model(torch.from_numpy(np.asarray(s, dtype=np.int64)[None, :-1])).float(), -1)[0].numpy()
            for s in seqs]


def decisions(model, tok, seqs, all_probs) -> tuple[dict, dict, float]:
    """Mean model probability and actual share of each decision after a note; mean probability
    the grammar mask removes there."""
    grammar = REMIGrammar(tok, strict_order=model.cfg.short_conv > 0)
    pos_lo, pos_hi = tok.range("Position")
    dur_lo, dur_hi = tok.range("Duration")
    prog_lo, prog_hi = tok.range("Program")
    n, removed = 0, 0.0
    p_sum, a_sum = dict.fromkeys(DECISIONS, 0.0), dict.fromkeys(DECISIONS, 0)
    for s, probs in zip(seqs, all_probs):
        s = np.asarray(s, dtype=np.int64)
        st = GrammarState()
        for i in range(len(s) - 1):
            grammar.advance(st, int(s[i]))
            if not dur_lo <= s[i] < dur_hi:
                continue
            p, nxt = probs[i], int(s[i + 1])
            cur, bar_len = st.pos, st.bar_len
            q = np.arange(pos_hi - pos_lo)
            near, far = pos_lo + q[(q > cur) & (q - cur <= BEAT)], pos_lo + q[q - cur > BEAT]
            late_bar = bar_len - cur > BEAT
            groups = {DECISIONS[0]: np.arange(prog_lo, prog_hi), DECISIONS[1]: near, DECISIONS[2]: far,
                      DECISIONS[3]: np.array([tok.bar_id] if late_bar else [], dtype=np.int64)}
            for name, ids in groups.items():
                p_sum[name] += float(p[ids].sum())
                a_sum[name] += int(nxt in ids)
            removed += float(p[~grammar.allowed(st, allow_eos=True)].sum())
            n += 1
    return {k: v / n for k, v in p_sum.items()}, {k: v / n for k, v in a_sum.items()}, removed / n


def stacking(tok, seqs, all_probs) -> dict[int, tuple[int, float, float, float]]:
    """By the number of notes already at the onset (1..5+), after a note, teacher-forced: (decisions,
    the model's mean probability of another note there, how often the songs add one, the model's
    mean probability of a Position at or before the current one, which the grammar forbids)."""
    pos_lo, pos_hi = tok.range("Position")
    dur_lo, dur_hi = tok.range("Duration")
    prog_lo, prog_hi = tok.range("Program")
    pitch_lo, pitch_hi = tok.range("Pitch")
    rows: dict[int, list] = {}
    for s, probs in zip(seqs, all_probs):
        s = np.asarray(s, dtype=np.int64)
        pos, count = -1, 0
        for i in range(len(s) - 1):
            t = s[i]
            if t == tok.bar_id:
                pos, count = -1, 0
            elif pos_lo <= t < pos_hi:
                pos, count = int(t - pos_lo), 0
            elif pitch_lo <= t < pitch_hi:
                count += 1
            elif dur_lo <= t < dur_hi and pos >= 0:
                p = probs[i]
                rows.setdefault(min(count, 5), []).append(
                    (p[prog_lo:prog_hi].sum(), prog_lo <= s[i + 1] < prog_hi, p[pos_lo:pos_lo + pos + 1].sum()))
    return {k: (len(v), *np.mean(np.array(v, dtype=np.float64), axis=0)) for k, v in sorted(rows.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="pop-piano")
    ap.add_argument("--pieces", type=int, default=16)
    ap.add_argument("--length", type=int, default=2048)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = load_model(args.model)
    model.eval()
    assert tok.config.beat_resolution == BEAT
    pop = DATA / "pop909"
    annotated = tok.config.chords
    cache = open_dataset(pop, tok.config, beats_dir=pop / "beats" if annotated else None,
                         chords_dir=pop / "chords" if annotated else None)
    real = [np.asarray(s)[: args.length] for s in cache.sequences("valid")]
    opts = SamplingOptions.for_model(Path(args.model).name)
    t0 = time.perf_counter()
    generated = []
    for b in range(0, args.pieces, 8):  # the seeds of benchmarks/music_metrics.py
        generated += sample(model, tok, num=min(8, args.pieces - b), length=args.length, seed=1000 + b,
                            options=opts).ids
    print(f"{args.model}: {len(generated)} pieces of {args.length} tokens from scratch (top-p {opts.top_p}, bar "
          f"top-p {opts.bar_top_p}, {time.perf_counter() - t0:.0f} s) against {len(real)} POP909 valid songs "
          f"(first {args.length} tokens)\n")
    gen_s, real_s = silence_split(generated, tok), silence_split(real, tok)
    print(f"{'silence, share of the time':<36}{'generated':>10}{'real':>10}{'ratio':>8}")
    for k in gen_s:
        print(f"{k:<36}{gen_s[k]:>10.3f}{real_s[k]:>10.3f}{gen_s[k] / real_s[k]:>8.2f}")
    real_probs = next_token_probs(model, real)
    p_real, a_real, rm_real = decisions(model, tok, real, real_probs)
    p_gen, a_gen, rm_gen = decisions(model, tok, generated, next_token_probs(model, generated))
    print(f"\n{'after a note':<36}{'real songs: model':>18}{'actual':>8}{'ratio':>7}"
          f"{'own pieces: model':>20}{'actual':>8}")
    for k in DECISIONS:
        print(f"{k:<36}{p_real[k]:>18.4f}{a_real[k]:>8.4f}{p_real[k] / max(a_real[k], 1e-9):>7.2f}"
              f"{p_gen[k]:>20.4f}{a_gen[k]:>8.4f}")
    print(f"{'probability the grammar removes':<36}{rm_real:>18.4f}{'':>15}{rm_gen:>20.4f}")
    print("\nafter the k-th note of an onset, real songs (teacher-forced): does the model keep count?")
    print(f"{'k':>4}{'decisions':>11}{'P(another note)':>17}{'actual':>8}{'ratio':>7}{'P(Position <= current)':>24}")
    for k, (n, p_more, a_more, p_back) in stacking(tok, real, real_probs).items():
        print(f"{str(k) + ('+' if k == 5 else ''):>4}{n:>11}{p_more:>17.3f}{a_more:>8.3f}{p_more / a_more:>7.2f}{p_back:>24.3f}")
    sizes = [np.unique(note_grid(s, tok).onset, return_counts=True)[1] for s in generated]
    real_sizes = [np.unique(note_grid(s, tok).onset, return_counts=True)[1] for s in real]
    g, r = np.concatenate(sizes), np.concatenate(real_sizes)
    print(f"\nonsets with 5 or more notes: generated {np.mean(g >= 5):.3f}, real {np.mean(r >= 5):.3f}; "
          f"7 or more: {np.mean(g >= 7):.4f}, {np.mean(r >= 7):.4f}; most at one onset: {g.max()}, {r.max()}")


if __name__ == "__main__":
    run_script(main)
