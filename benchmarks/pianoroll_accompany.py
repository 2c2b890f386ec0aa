"""Piano rolls of a POP909 song's first bars and of pop-piano's accompaniment of its melody,
one above the other, for the README (16 bars at most of one song may be shown, credited).

    python benchmarks/pianoroll_accompany.py [--song 001] [--bars 16] [--seed 1] [--model pop-piano] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from spemusic.generation.accompany import hold_melody, load_melody
from spemusic.generation.sampling import sample
from spemusic.music.harmony import chart_melody
from spemusic.music.pianoroll import render
from spemusic.options import CHORD_STRENGTH

from _errors import run_script  # (benchmarks/, the script's own folder)

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "pop909"
OUT = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--song", default="001")
    ap.add_argument("--bars", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--model", default="pop-piano")
    ap.add_argument("--out", type=Path, default=OUT, help="folder of the pictures")
    args = ap.parse_args()
    from spemusic.generation.sampling import SamplingOptions
    from spemusic.nn.checkpoint import load_model

    model, tok, info = load_model(args.model, return_info=True)
    opts = SamplingOptions.for_model(info.get("name"))  # accompany's defaults
    beats = DATA / "beats" / f"{args.song}.txt"
    melody = load_melody(DATA / f"{args.song}.mid", tok, beats=beats)
    song = tok.encode(DATA / f"{args.song}.mid", beats=beats, chords=DATA / "chords" / f"{args.song}.txt")
    # from the first bar with a melody note, args.bars bars
    bar_at = np.flatnonzero(melody.ids == tok.bar_id)
    first = int(np.searchsorted(bar_at, np.flatnonzero(melody.ids == tok.part_id("melody"))[0], side="right"))
    cut = melody.ids[: bar_at[min(first - 1 + args.bars, len(bar_at) - 1)]]
    chart = chart_melody(model, cut, tok)  # as `spemusic accompany` plays it: on the harmonizer's chart
    ids = sample(model, tok, num=1, bars=int(np.count_nonzero(cut == tok.bar_id)), seed=args.seed, options=opts,
                 held=hold_melody(cut, tok), chords=chart, chord_strength=CHORD_STRENGTH if chart else 0.0).ids[0]
    shown = (first, first - 1 + args.bars)
    for name, seq, title in ((f"pianoroll_pop909_{args.song}.png", song, f"POP909 song {args.song} (MIT)"),
                             (f"pianoroll_accompany_{args.song}.png", ids,
                              f"pop-piano accompanying song {args.song}'s melody, seed {args.seed}")):
        (args.out / name).write_bytes(render(tok.decode_to_score(seq), ".png", bars=shown, title=title))
        print(f"wrote {args.out / name} (bars {shown[0]}-{shown[1]})")


if __name__ == "__main__":
    run_script(main)
