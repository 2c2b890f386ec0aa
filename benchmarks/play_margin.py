"""`spemusic play`: its sampling margin (seconds of music sampled per second of sampling: above 1,
sampling keeps ahead of the music) for both shipped models, as `play --stdout` (every bar's audio
rendered) and `play --stdout-midi` (MIDI events) run it, on the code before the compiled step
(OLD, a temporary worktree: the eager step) and on this tree, side by side in one run; then one
long run of this tree (an hour of pop-piano's music by default): the margin and the memory over
each sixth of it, which stay flat.

The player writes into a sink that drops what it gets. The clock is real for the work and skips
the waiting (a sleep returns at once and moves the clock on), so a run takes the sampling time
only. Each measurement is a fresh process.

    python benchmarks/play_margin.py [--bars 240] [--long-bars 2400] [--models pop-piano groove] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _errors import run_script
from revision import OLD, REPO, checkout, run_json  # (benchmarks/, the script's own folder)


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


def worker(model_name: str, output: str, bars: int, threads: int, seed: int) -> dict:
    """Play `bars` bars into a sink: the margin, and at each sixth of the run the memory and the
    margin since the last mark."""
    import torch

    from spemusic.generation.play import Player, play
    from spemusic.generation.sampling import sample
    from spemusic.music.audio import find_soundfont
    from spemusic.nn.checkpoint import load_model

    torch.set_num_threads(threads)
    model, tok = load_model(model_name)
    sample(model, tok, length=2, seed=seed)  # the compiled step loaded (or compiled, once) before the clock runs
    clock = SkippingClock()
    player = (Player(midi_out=lambda message: None, clock=clock) if output == "midi" else
              Player(audio_out=lambda block: None, soundfont=find_soundfont(), clock=clock))
    marks = sorted({max(bars // 6, 1) * k for k in range(1, 7)} | {bars})
    at, last = [], [0.0, 0.0]

    def on_bar(report):
        if report.bars in marks:
            music, busy = report.sampled_seconds - last[0], report.sampling_seconds - last[1]
            at.append({"bar": report.bars, "rss": rss_mib(), "margin": music / max(busy, 1e-9)})
            last[:] = [report.sampled_seconds, report.sampling_seconds]

    result = play(model, tok, player, seed=seed, bars=bars, on_bar=on_bar, record=True)
    return {"music": result.sampled_seconds, "tokens": len(result.tokens), "busy": result.sampling_seconds,
            "margin": result.margin, "marks": at}


def _run(root: Path, *args) -> dict:
    return run_json(Path(__file__), ["--worker", *args], root)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bars", type=int, default=240)
    ap.add_argument("--long-bars", type=int, default=2400, help="the long run's bars (0: none)")
    ap.add_argument("--models", nargs="+", default=["pop-piano", "groove"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--old", default=OLD, metavar="REV", help=f"the old path's revision [default: {OLD}]")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        name, output, bars, threads, seed = args.worker
        print(json.dumps(worker(name, output, int(bars), int(threads), int(seed))))
        return
    common = [args.bars, args.threads, args.seed]
    print(f"{args.bars} bars per run, {args.threads} thread(s), seed {args.seed}; old: {args.old} (the eager step), "
          "new: this tree; margin = seconds of music sampled per second of sampling")
    print(f"{'model':<10} {'output':<14} {'music':>7} {'old tok/s':>10} {'new tok/s':>10} {'old margin':>11} "
          f"{'new margin':>11} {'new/old':>8}")
    with checkout(args.old) as old_root:
        for name in args.models:
            for output, flag in (("audio", "--stdout"), ("midi", "--stdout-midi")):
                old, new = _run(old_root, name, output, *common), _run(REPO, name, output, *common)
                minutes, secs = divmod(new["music"], 60)
                print(f"{name:<10} {flag:<14} {int(minutes):>4}:{secs:02.0f} {old['tokens'] / old['busy']:>10.0f} "
                      f"{new['tokens'] / new['busy']:>10.0f} {old['margin']:>10.1f}x {new['margin']:>10.1f}x "
                      f"{new['margin'] / old['margin']:>7.2f}x")
    if args.long_bars:
        name = args.models[0]
        long = _run(REPO, name, "audio", args.long_bars, args.threads, args.seed)
        minutes, secs = divmod(long["music"], 60)
        print(f"\nthis tree, {name} --stdout, {args.long_bars} bars ({int(minutes)}:{secs:02.0f} of music, "
              f"{long['tokens']} tokens): margin {long['margin']:.1f}x; over each stretch up to the bar:")
        print("  ".join(f"{m['bar']:>6}" for m in long["marks"]) + "   bar")
        print("  ".join(f"{m['margin']:>5.1f}x" for m in long["marks"]) + "   margin")
        print("  ".join(f"{m['rss']:>6.0f}" for m in long["marks"]) + "   RSS MiB")


if __name__ == "__main__":
    run_script(main)
