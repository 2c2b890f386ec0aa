"""The sampler alone: ms per sampling step of `spemusic generate`'s loop with the model's step
taken out, for the code of a git revision and for this tree, side by side in one run.

The model's recurrent step is replaced by a stub that hands back real pop-piano logits (64
positions of one of its pieces, in turn), so what is timed is the sampler's own work at every
token: the grammar mask, the chord and onset corrections (hole penalty, stacking, onset nucleus),
the bar nucleus, the draw and the bookkeeping, with every pop-piano default. Batch 1 and 8,
alternating fresh processes, 3 rounds each (the best counts).

    python benchmarks/sampler_speed.py [--old REV] [--tokens 3000] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from _errors import run_script
from revision import checkout, run_json

OLD = "71980e1"  # the sampler in torch ops, before it ran in numpy (issue 38)


def measure(batch: int, tokens: int, seed: int) -> float:
    """ms per sampling step of `batch` pieces, the model's step stubbed out."""
    import spemusic.generation.sampling as sampling
    from spemusic import load_model
    from spemusic.generation.settings import SamplingOptions

    model, tok = load_model("pop-piano")
    options = SamplingOptions.for_model("pop-piano")
    piece = sampling.sample(model, tok, length=64, seed=0, options=options).ids[0][:64]
    with torch.inference_mode():
        logits = model(torch.from_numpy(piece[None]))[0].float()  # (64, V)

    class Stub:
        """The step: the next of the recorded positions' logits, for every piece of the batch."""
        def __init__(self):
            self.at = 0

        def __call__(self, state, ids, want_hidden=False):
            self.at = (self.at + 1) % len(logits)
            return logits[self.at][None].expand(len(ids), -1).clone(), state

    sampling.StepGraph.of = staticmethod(lambda model, state: Stub())
    sampling.sample(model, tok, num=batch, length=8, seed=seed, options=options)  # warm
    t0 = time.perf_counter()
    out = sampling.sample(model, tok, num=batch, length=tokens // batch, seed=seed, options=options)
    return (time.perf_counter() - t0) * 1e3 / out.new_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", default=OLD, metavar="REV", help=f"the old sampler's revision [default: {OLD}]")
    ap.add_argument("--tokens", type=int, default=3000, help="tokens sampled per measurement")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one measurement, in a subprocess
    ap.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.json:
        print(json.dumps({"ms": measure(args.batch, args.tokens, args.seed)}))
        return
    here = Path(__file__).resolve()
    print(f"the sampler alone (the model's step stubbed), pop-piano's defaults, {args.threads} thread(s), "
          f"{args.tokens} tokens a measurement; ms per sampling step, best of 3 rounds")
    print(f"{'batch':>5}  {'old ' + args.old:>14}  {'new (this tree)':>16}  {'speedup':>8}")
    with checkout(args.old) as old_root:
        for batch in (1, 8):
            best = {"old": float("inf"), "new": float("inf")}
            for r in range(3):
                for side, root in (("old", old_root), ("new", here.parents[1])):
                    flags = ["--batch", batch, "--tokens", args.tokens, "--seed", r + 1, "--threads", args.threads]
                    best[side] = min(best[side], run_json(here, flags, root)["ms"])
            print(f"{batch:>5}  {best['old']:>14.3f}  {best['new']:>16.3f}  {best['old'] / best['new']:>7.2f}x",
                  flush=True)


if __name__ == "__main__":
    run_script(main)
