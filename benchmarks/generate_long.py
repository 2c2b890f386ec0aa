"""Long generation at constant cost per token: wall time, per-token time and peak memory of
the sampler behind `spemusic generate --length` (spemusic.generation.sampling.sample with the model's
`generate` defaults, no MIDI written) at 1,000 / 8,000 / 64,000 tokens with the default model
(each in a fresh process), and tokens/s for --num 1 vs --num 8, side by side in one run. With
`--repeat 0 --onset-top-p 1 --hole-penalty 0 --stacking 1`: the model alone, without the
continuous cache and the onset steering.

    python benchmarks/generate_long.py                 # ~3 min on 2 CPU cores
    python benchmarks/generate_long.py --lengths 1000 8000 --model groove
    python benchmarks/generate_long.py --repeat 0 --onset-top-p 1 --hole-penalty 0 --stacking 1
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from _errors import run_script  # (benchmarks/, the script's own folder)


def child(model: str, length: int, num: int, seed: int, asked: dict) -> None:
    """Run in a fresh process: sample, print one JSON line with timings and peak RSS."""
    import torch

    from spemusic.generation.sampling import SamplingOptions, sample
    from spemusic.nn.checkpoint import load_model

    if num <= 2:
        torch.set_num_threads(1)  # as `spemusic generate` does for batch-1 sampling
    model_, tok = load_model(model)
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    times = []
    last = [time.perf_counter()]

    def on_token(n, bars):
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    options = SamplingOptions.for_model(model, **asked)  # what `generate` samples with
    result = sample(model_, tok, num=num, length=length, seed=seed, on_token=on_token, options=options)
    tail = times[-min(1000, len(times) // 2):]
    head = times[5: 5 + len(tail)]
    print(json.dumps({
        "length": length, "num": num, "wall_s": result.wall_seconds,
        "tokens_per_s": result.new_tokens * num / result.wall_seconds,
        "ms_per_step_first": 1e3 * sum(head) / max(len(head), 1),
        "ms_per_step_last": 1e3 * sum(tail) / max(len(tail), 1),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rss_after_load_mb": rss_loaded,
        "repeat": options.repeat, "onset_top_p": options.onset_top_p, "hole_penalty": options.hole_penalty,
        "stacking": options.stacking,
    }))


def run(model: str, length: int, num: int, asked: dict, seed: int = 0) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", model, str(length), str(num), str(seed),
                          json.dumps(asked)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="pop-piano")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1000, 8000, 64000])
    ap.add_argument("--repeat", type=float, default=None, help="default: the model's, as generate has it")
    ap.add_argument("--onset-top-p", type=float, default=None, help="default: the model's, as generate has it")
    ap.add_argument("--hole-penalty", type=float, default=None, help="default: the model's, as generate has it")
    ap.add_argument("--stacking", type=float, default=None, help="default: the model's, as generate has it")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        m, length, num, seed, asked = args.child
        child(m, int(length), int(num), int(seed), json.loads(asked))
        return
    asked = {"repeat": args.repeat, "onset_top_p": args.onset_top_p, "hole_penalty": args.hole_penalty,
             "stacking": args.stacking}
    rows = [run(args.model, n, 1, asked) for n in args.lengths]
    print(f"model {args.model}, batch 1, fresh process per run, repeat {rows[0]['repeat']} "
          f"(the continuous cache's share; 0: off), onset top-p {rows[0]['onset_top_p']}, "
          f"hole penalty {rows[0]['hole_penalty']}, stacking {rows[0]['stacking']}")
    base = rows[0]
    print(f"{'length':>8}{'wall s':>9}{'tok/s':>8}{'ms/tok first':>14}{'ms/tok last':>13}{'vs 1st run':>12}"
          f"{'peak MB':>9}{'vs 1st run':>12}")
    for r in rows:
        print(f"{r['length']:>8}{r['wall_s']:>9.1f}{r['tokens_per_s']:>8.0f}{r['ms_per_step_first']:>14.2f}"
              f"{r['ms_per_step_last']:>13.2f}{r['ms_per_step_last'] / base['ms_per_step_last']:>11.2f}x"
              f"{r['peak_rss_mb']:>9.0f}{r['peak_rss_mb'] / base['peak_rss_mb']:>11.2f}x")
    b1, b8 = run(args.model, 1000, 1, asked), run(args.model, 1000, 8, asked)
    print(f"\nbatch 1: {b1['tokens_per_s']:.0f} tok/s; batch 8: {b8['tokens_per_s']:.0f} tok/s "
          f"({b8['tokens_per_s'] / b1['tokens_per_s']:.2f}x; goal >= 4x)")


if __name__ == "__main__":
    run_script(main)
