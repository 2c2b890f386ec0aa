"""Does a model with parts know how a melody moves? Teacher-forced on the POP909 valid songs.

At every melody note of the real songs (the first --max-len tokens of each), the model's
distribution of the next melody pitch, given the song so far, is read as a distribution of
intervals from the melody's previous note (unison, steps of 1-2 semitones, thirds, fourths and
fifths, larger leaps), averaged over the notes, beside the real intervals. A model that writes a
singable line puts its mass where the real melody goes; one that cannot find the melody's last
note in the stream spreads it over the chord. Also the melody pitch's own NLL, and the nats per
note of each part's tokens (Program, Pitch, Velocity, Duration), models side by side. The intervals are also
read apart for a bar's first melody note (its last note is behind the bar line and, melody first,
behind the whole of the last bar's other parts) and for the notes within a bar.

    python benchmarks/melody_intervals.py [MODEL ...] [--max-len 2048]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from spemusic.music.metrics import INTERVALS
from spemusic.nn.checkpoint import load_model
from spemusic.training.data import open_dataset
from spemusic.training.evaluate import part_nll

from _errors import run_script

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "pop909"


@torch.no_grad()
def measure(name: str, max_len: int) -> dict:
    model, tok = load_model(name)
    if not tok.config.parts:
        raise SystemExit(f"error: {name} has no parts")
    cache = open_dataset(DATA, tok.config, beats_dir=DATA / "beats", chords_dir=DATA / "chords")
    melody = tok.token_to_id["Program_melody"]
    lo, hi = tok.range("Pitch")
    steps = np.arange(128)
    groups = ("all", "across a bar line", "within a bar")
    predicted = {g: dict.fromkeys(INTERVALS, 0.0) for g in groups}
    real = {g: dict.fromkeys(INTERVALS, 0) for g in groups}
    count = dict.fromkeys(groups, 0)
    pitch_nll, notes, pieces = 0.0, 0, []
    model.resample(0)
    for seq in cache.sequences("valid"):
        ids = np.asarray(seq[: max_len + 1], dtype=np.int64)
        logp = torch.log_softmax(model(torch.from_numpy(ids[None, :-1])).float(), -1)[0].numpy()
        targets = ids[1:]
        pieces.append((targets, -logp[np.arange(len(targets)), targets]))
        # melody pitches: ids[i] is Program_melody and ids[i + 1] its Pitch, predicted at row i
        at = np.flatnonzero((ids[:-1] == melody) & (ids[1:] >= lo) & (ids[1:] < hi))
        pitches = ids[at + 1] - lo
        bars = np.cumsum(ids == tok.bar_id)
        for j, before, now in zip(range(1, len(at)), pitches[:-1], pitches[1:]):
            i = at[j]
            p = np.exp(logp[i, lo:hi] - logp[i, lo:hi].max())
            p /= p.sum()
            moved = np.abs(steps - before)
            for g in ("all", "across a bar line" if bars[i] > bars[at[j - 1]] else "within a bar"):
                count[g] += 1
                for key, (a, b) in INTERVALS.items():
                    predicted[g][key] += float(p[(moved >= a) & (moved <= b)].sum())
                    real[g][key] += int(a <= abs(int(now) - int(before)) <= b)
            pitch_nll -= float(logp[i, lo + now])
            notes += 1
    parts = part_nll(tok, pieces)
    total_notes = sum(p["notes"] for n, p in parts.items() if n != "shared")
    share = lambda d: {g: {k: v / max(1, count[g]) for k, v in d[g].items()} for g in groups}  # noqa: E731
    return {"notes": notes, "count": count, "predicted": share(predicted), "real": share(real),
            "melody_pitch_nll": pitch_nll / notes,
            "parts": {n: p["nll"] / (p["notes"] or total_notes) for n, p in parts.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["pop-piano"])
    ap.add_argument("--max-len", type=int, default=2048)
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    results = {m: measure(m, args.max_len) for m in args.models}
    first = next(iter(results.values()))
    print(f"POP909 valid, teacher-forced, first {args.max_len} tokens of each song: {first['notes']} melody notes")
    for g, n in first["count"].items():
        print(f"\n{'next melody interval':<24}" + "".join(f"{m:>16}" for m in results) + f"{'real':>10}"
              + f"   ({g}: {n} notes)")
        for key in INTERVALS:
            print(f"{key:<24}" + "".join(f"{r['predicted'][g][key]:>16.3f}" for r in results.values())
                  + f"{first['real'][g][key]:>10.3f}")
    print(f"{'melody pitch NLL (nats)':<24}" + "".join(f"{r['melody_pitch_nll']:>16.3f}" for r in results.values()))
    print("\nnats per note, each part's note tokens (shared: bars, positions, chords, tempo, per note)")
    for part in first["parts"]:
        print(f"{part:<24}" + "".join(f"{r['parts'].get(part, float('nan')):>16.3f}" for r in results.values()))


if __name__ == "__main__":
    run_script(main)
