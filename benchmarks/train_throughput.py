"""Training throughput of the `small` preset on this machine, fp32 vs bf16 autocast, side by
side, with the fraction of the measured matmul peak (same dtype) it reaches, and the precision
`--precision auto` picks here. Defaults: the configuration pop-piano v2 trains with (seq-len 2,048,
batch 2, gated sineSPE, short convolution of 4). The two precisions' steps alternate, and each
figure is the median step, so that a busy or throttled machine slows both alike.

    python benchmarks/train_throughput.py [--steps 6] [--batch-size 2] [--seq-len 2048] [--pe sinespe]
                                          [--short-conv 24] [--compare REV] [--cold]

--compare REV: the same measurement for the code of git revision REV (a temporary worktree) and
for this tree, in alternating subprocesses (3 rounds each; the best round counts), printed side
by side with the ratio: before/after figures from one run on one machine.

Model FLOPs per token are counted by torch.utils.flop_counter on one forward+backward pass (the
matrix products the implementation really does), so the utilisation is that of this code. The
step is the trainer's: its loss, its optimizer (``train.build_optimizer`` where the revision has
it), gradient clipping.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from spemusic import ModelConfig, Performer

from revision import REPO, checkout, run_json, spemusic_module  # (benchmarks/, the script's own folder)


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 10) -> float:
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def make_optimizer(model):
    try:
        build_optimizer = spemusic_module("training.train").build_optimizer
    except AttributeError:  # a revision from before build_optimizer: its AdamW, as its trainer made it
        return torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))
    return build_optimizer(model, 1e-4, 0.1, torch.device("cpu"))


def timed_step(model, opt, x, dtype) -> float:
    t0 = time.perf_counter()
    train_step(model, opt, x, dtype)
    return time.perf_counter() - t0


def train_step(model, opt, x, dtype):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--pe", default="sinespe")
    ap.add_argument("--attention", default="favor")
    ap.add_argument("--short-conv", type=int, default=24, help="pop-piano v2's (c24 candidate) is 24")
    ap.add_argument("--compare", metavar="REV", help="also measure git revision REV, side by side")
    ap.add_argument("--cold", action="store_true", help="compile into an empty inductor cache (a first run)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one measurement, for --compare
    args = ap.parse_args()
    if args.cold:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-cold-")
    if args.compare:
        return compare(args)
    try:
        device_module = spemusic_module("nn.device")
    except ImportError:  # a revision from before device.py
        device_module = spemusic_module("training.train")
    cpu_has_fast_bf16, pick_dtype = device_module.cpu_has_fast_bf16, device_module.pick_dtype

    torch.manual_seed(0)
    cfg = ModelConfig.preset("small", vocab_size=589, pe=args.pe, attention=args.attention,
                             short_conv=args.short_conv)
    model = Performer(cfg).train()
    opt = make_optimizer(model)
    x = torch.randint(3, 589, (args.batch_size, args.seq_len + 1))
    tokens = args.batch_size * args.seq_len
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    # the first step of each dtype compiles the step's compiled regions for it
    first = {name: timed_step(model, opt, x, dtype) for name, dtype in dtypes.items()}
    times = {name: [] for name in dtypes}
    for _ in range(args.steps):  # the dtypes alternate, so that a busy machine slows both alike
        for name, dtype in dtypes.items():
            times[name].append(timed_step(model, opt, x, dtype))
    results = {name: tokens / statistics.median(t) for name, t in times.items()}
    if args.json:
        print(json.dumps(results))
        return
    with torch._dynamo.config.patch(disable=True), FlopCounterMode(display=False) as counter:
        train_step(model, opt, x, torch.float32)
    flops_per_token = counter.get_total_flops() / tokens
    print(f"small preset ({model.num_parameters() / 1e6:.2f}M parameters), pe={args.pe}, attention={args.attention}, "
          f"short conv {cfg.short_conv}, seq-len {args.seq_len}, batch {args.batch_size}, {torch.get_num_threads()} "
          f"threads; {flops_per_token / 1e6:.1f} MFLOP per token (forward + backward, counted)")
    for name, seconds in first.items():
        print(f"first {name} step (compiling, inductor cache {'cold' if args.cold else 'as found'}): {seconds:.1f} s")
    print(f"{'dtype':<6}{'tokens/s':>10}{'matmul peak GFLOP/s':>22}{'achieved GFLOP/s':>19}{'of peak':>9}")
    for name, dtype in dtypes.items():
        tps = results[name]
        peak = matmul_peak(dtype)
        achieved = flops_per_token * tps
        print(f"{name:<6}{tps:>10.0f}{peak / 1e9:>22.0f}{achieved / 1e9:>19.1f}{achieved / peak:>8.0%}")
    chosen, why = pick_dtype("auto", torch.device("cpu"), cfg, args.batch_size, args.seq_len)
    chosen_name = "bf16" if chosen == torch.bfloat16 else "fp32"
    print(f"--precision auto here: {chosen_name} ({why})")
    if cpu_has_fast_bf16():
        print(f"before auto measured (bf16 on any CPU with bf16 instructions): {results['bf16']:,.0f} tokens/s; "
              f"now {results[chosen_name]:,.0f}, {results[chosen_name] / results['bf16']:.2f}x")


def compare(args) -> None:
    """Alternate subprocesses of REV's code and this tree's, 3 rounds each; print the best of each."""
    worker = ["--steps", args.steps, "--batch-size", args.batch_size, "--seq-len", args.seq_len, "--pe", args.pe,
              "--attention", args.attention, "--short-conv", args.short_conv]
    best = {"before": {}, "after": {}}
    with checkout(args.compare) as base:
        for _ in range(3):
            for side, root in (("before", base), ("after", REPO)):
                for name, tps in run_json(Path(__file__), worker, root).items():
                    best[side][name] = max(best[side].get(name, 0.0), tps)
    print(f"small preset, pe={args.pe}, attention={args.attention}, short conv {args.short_conv}, seq-len "
          f"{args.seq_len}, batch {args.batch_size}, {torch.get_num_threads()} threads; best of 3 rounds, "
          f"each the median of {args.steps} steps")
    print(f"{'dtype':<6}{args.compare + ' tok/s':>22}{'this tree tok/s':>18}{'ratio':>8}")
    for name in ("fp32", "bf16"):
        b, a = best["before"][name], best["after"][name]
        print(f"{name:<6}{b:>22,.0f}{a:>18,.0f}{a / b:>7.2f}x")
    top_b, top_a = max(best["before"].values()), max(best["after"].values())
    print(f"best precision: {top_b:,.0f} -> {top_a:,.0f} tokens/s, {top_a / top_b:.2f}x")


if __name__ == "__main__":
    main()
