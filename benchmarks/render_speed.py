"""Audio rendering speed, as a multiple of real time, on one core: spemusic's renderer (symusic's
prestosynth) with each SoundFont found, side by side with FluidSynth's fast-render mode on the same
files when the `fluidsynth` program is installed (apt-get install fluidsynth).

    python benchmarks/render_speed.py [--files 4] [--repeats 3]

Inputs: the first POP909 songs and Groove pieces of ../shared/data. The process is pinned to one
core (os.sched_setaffinity) and FluidSynth is run under `taskset -c` on the same core.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import symusic

from spemusic.music.audio import SAMPLE_RATE, bundled_soundfont, render, soundfont_candidates

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=4, help="files of each data set")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    sets = {"pop909": sorted((DATA / "pop909").glob("*.mid"))[:args.files],
            "groove": sorted((DATA / "groove").rglob("*.mid"))[:args.files]}
    fonts = [p for p in soundfont_candidates() if p.is_file() and not p.is_symlink()]
    fonts = list(dict.fromkeys([*fonts, bundled_soundfont()]))
    fluidsynth = shutil.which("fluidsynth")
    print(f"one core (cpu {core}), {SAMPLE_RATE} Hz stereo, best of {args.repeats}; x real time = seconds of "
          "music per second of rendering")
    print(f"{'files':<8} {'SoundFont':<16} {'MB':>5} {'music s':>8} {'spemusic (prestosynth)':>23} "
          f"{'fluidsynth -F':>14} {'ratio':>6}")
    for name, files in sets.items():
        scores = [symusic.Score(str(f)) for f in files]
        music = sum(s.to("second").end() for s in scores)
        for font in fonts:
            ours = best_of(args.repeats, lambda font=font, scores=scores: [render(s, font) for s in scores])
            theirs = None
            if fluidsynth:
                with tempfile.TemporaryDirectory() as tmp:
                    def run_fluidsynth(files=files, font=font):
                        for f in files:
                            subprocess.run(["taskset", "-c", str(core), fluidsynth, "-ni", "-q", "-r",
                                            str(SAMPLE_RATE), "-F", f"{tmp}/out.wav", str(font), str(f)],
                                           check=True, capture_output=True)
                    theirs = best_of(args.repeats, run_fluidsynth)
            fs = f"{music / theirs:13.0f}x" if theirs else f"{'not installed':>14}"
            ratio = f"{theirs / ours:5.1f}x" if theirs else ""
            print(f"{name:<8} {font.name:<16} {font.stat().st_size / 2**20:5.0f} {music:8.0f} "
                  f"{music / ours:22.0f}x {fs} {ratio:>6}")


if __name__ == "__main__":
    main()
