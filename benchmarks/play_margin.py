"""`spemusic play`: its sampling margin (seconds of music sampled per second of sampling: above 1,
sampling keeps ahead of the music) for both shipped models, and its memory over a long run.

The player renders every bar's audio, as `play --stdout` does, into a sink that drops it. The
clock is real for the work and skips the waiting (a sleep returns at once and moves the clock on),
so the run takes the sampling time only.

    python benchmarks/play_margin.py [--bars 240] [--models pop-piano groove] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from spemusic.generation.play import Player, play
from spemusic.music.audio import find_soundfont
from spemusic.nn.checkpoint import load_model

from _errors import run_script  # (benchmarks/, the script's own folder)


class SkippingClock:
    def __init__(self):
        self.skipped = 0.0

    def now(self) -> float:
        return time.monotonic() + self.skipped

    def sleep(self, seconds: float) -> None:
        self.skipped += max(seconds, 0.0)


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bars", type=int, default=240)
    ap.add_argument("--models", nargs="+", default=["pop-piano", "groove"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--midi-only", action="store_true", help="MIDI events only, no audio rendering")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    font = find_soundfont()
    marks = sorted({10, *range(args.bars // 6, args.bars + 1, max(args.bars // 6, 1))})
    output = "MIDI events only" if args.midi_only else f"audio rendered with {font.name}"
    print(f"{args.bars} bars per model, {args.threads} thread(s), {output}; RSS in MiB")
    print(f"{'model':<10} {'music':>8} {'tokens':>7} {'tok/s':>6} {'margin':>7}  " +
          "  ".join(f"{'RSS@' + str(m):>8}" for m in marks))
    for name in args.models:
        model, tok = load_model(name)
        clock = SkippingClock()
        player = (Player(midi_out=lambda message: None, clock=clock) if args.midi_only else
                  Player(audio_out=lambda block: None, soundfont=font, clock=clock))
        rss, tokens = {}, 0

        def on_bar(report, player=player, rss=rss):
            nonlocal tokens
            n = len(player.bar_ends)
            if n in marks:
                rss[n] = rss_mib()

        result = play(model, tok, player, seed=args.seed, bars=args.bars, on_bar=on_bar, record=True)
        tokens = len(result.tokens)
        minutes, secs = divmod(result.sampled_seconds, 60)
        print(f"{name:<10} {int(minutes):>4}:{secs:04.1f} {tokens:7d} {tokens / result.sampling_seconds:6.0f} "
              f"{result.margin:6.1f}x  " + "  ".join(f"{rss.get(m, float('nan')):8.1f}" for m in marks))


if __name__ == "__main__":
    run_script(main)
