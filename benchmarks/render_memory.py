"""Peak memory of `spemusic render` against the song's length: piano songs of 1, 5 and 20 minutes
(made here, in code: chords and a melody at 120 BPM), each rendered to .wav, .flac and .ogg in a
fresh process that reports its own peak resident memory. `render` synthesises 30 s of onsets at a
time and streams the encoded audio to the file, so the peak should not grow with the length.

    python benchmarks/render_memory.py [--minutes 1 5 20] [--formats wav flac ogg]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import symusic

CHILD = """
import resource, sys, time
from pathlib import Path
from spemusic.music.audio import find_soundfont, render_file
t = time.perf_counter()
seconds = render_file(Path(sys.argv[1]), Path(sys.argv[2]), find_soundfont())
print(seconds, time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def piano_song(minutes: float, seed: int = 0) -> symusic.Score:
    """Four-beat bars at 120 BPM: a chord on every beat under an eighth-note melody."""
    rng = np.random.default_rng(seed)
    tpq, beats = 480, int(minutes * 120)
    score = symusic.Score(tpq)
    track = symusic.Track(name="PIANO", program=0)
    roots = rng.choice([48, 53, 55, 57], size=beats // 4 + 1)
    for b in range(beats):
        for pitch in roots[b // 4] + np.array([0, 4, 7]):
            track.notes.append(symusic.Note(b * tpq, tpq, int(pitch), 60))
        for half in range(2):
            track.notes.append(symusic.Note(b * tpq + half * tpq // 2, tpq // 2, int(rng.integers(67, 80)), 80))
    score.tracks.append(track)
    return score


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, nargs="+", default=[1, 5, 20])
    ap.add_argument("--formats", nargs="+", default=["wav", "flac", "ogg"])
    args = ap.parse_args()
    print(f"{'song':>8} {'format':>6} {'audio s':>8} {'render s':>9} {'peak MiB':>9} {'file MiB':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for minutes in args.minutes:
            src = Path(tmp) / f"song_{minutes:g}min.mid"
            piano_song(minutes).dump_midi(str(src))
            for fmt in args.formats:
                dest = Path(tmp) / f"out.{fmt}"
                out = subprocess.run([sys.executable, "-c", CHILD, str(src), str(dest)], capture_output=True,
                                     text=True, check=True).stdout.split()
                seconds, wall, peak_kib = float(out[0]), float(out[1]), int(out[2])
                print(f"{minutes:>6g} m {fmt:>6} {seconds:>8.0f} {wall:>9.1f} {peak_kib / 1024:>9.0f} "
                      f"{dest.stat().st_size / 2**20:>9.1f}")
                dest.unlink()


if __name__ == "__main__":
    main()
