"""Length-extrapolation study (the SPE paper's claim): train models that differ only in their
positional encoding, with the same size, data, seed and token budget, at a short training length,
then score each on the valid split far beyond it.

    python benchmarks/extrapolation.py                         # tiny models, CPU, ~15 min
    python benchmarks/extrapolation.py --preset small --steps 3000 --device cuda

Prints mean NLL in [seq_len/2, seq_len) and in [max_len/2, max_len) for each model and their
ratio, and writes the JSON and a plot into --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _errors import run_script  # (benchmarks/, the script's own folder)

CONFIGS = [  # (name, train options)
    ("ape", ["--pe", "ape"]),
    ("axial", ["--pe", "axial"]),
    ("axial-continuous", ["--pe", "axial-continuous"]),
    ("sinespe-gated", ["--pe", "sinespe", "--gated"]),
    ("sinespe-ungated", ["--pe", "sinespe", "--no-gated"]),
    ("convspe-gated", ["--pe", "convspe", "--gated"]),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "pop909"))
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="benchmarks/results/extrapolation")
    ap.add_argument("--only", nargs="*", help="subset of: " + " ".join(n for n, _ in CONFIGS))
    ap.add_argument("--skip-training", action="store_true", help="score the runs already in --out")
    args = ap.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    configs = [c for c in CONFIGS if not args.only or c[0] in args.only]
    budget = args.steps * args.batch_size * args.seq_len
    print(f"{len(configs)} models, preset {args.preset}, seq-len {args.seq_len}, {args.steps} steps x "
          f"{args.batch_size} sequences = {budget:,} tokens each; scored up to {args.max_len} tokens")
    for name, opts in configs:
        run = out / "runs" / name
        if args.skip_training or (run / "last").exists():
            continue
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "spemusic", "train", args.data, "-o", str(run), "--preset", args.preset,
               "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size), "--steps", str(args.steps),
               "--lr", str(args.lr), "--warmup", str(max(1, args.steps // 20)), "--val-every", str(args.steps),
               "--save-every", str(args.steps), "--seed", "0", "--device", args.device,
               "--max-len", str(args.max_len), *opts]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        print(f"trained {name} in {time.perf_counter() - t0:.0f} s")

    from spemusic.nn.checkpoint import load_model
    from spemusic.training.evaluate import evaluate_nll, plot_reports

    reports = []
    for name, _ in configs:
        model, tok, info = load_model(out / "runs" / name / "last", device=args.device, return_info=True)
        reports.append(evaluate_nll(model, tok, Path(args.data), "valid", args.max_len, 128, name=name,
                                    trained_len=args.seq_len, device=args.device))
    lo, hi = (args.seq_len // 2, args.seq_len), (args.max_len // 2, args.max_len)
    print(f"\n{'model':<18}{'NLL [{},{})'.format(*lo):>16}{'NLL [{},{})'.format(*hi):>18}{'ratio':>8}{'mean':>8}")
    rows = []
    for r in reports:
        a, b = r.mean_between(*lo), r.mean_between(*hi)
        rows.append({"model": r.model, "nll_trained": a, "nll_far": b, "ratio": b / a, "mean_nll": r.mean_nll})
        print(f"{r.model:<18}{a:>16.4f}{b:>18.4f}{b / a:>8.3f}{r.mean_nll:>8.4f}")
    (out / "results.json").write_text(json.dumps({"settings": vars(args), "tokens_per_model": budget, "rows": rows,
                                                  "reports": [r.to_dict() for r in reports]}, indent=2))
    plot_reports(reports, out / "extrapolation.png")
    print(f"\nwrote {out / 'results.json'} and {out / 'extrapolation.png'}")


if __name__ == "__main__":
    run_script(main)
