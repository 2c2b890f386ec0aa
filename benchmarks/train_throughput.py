"""Training throughput of the `small` preset on this machine, fp32 vs bf16 autocast, side by
side, with the fraction of the measured matmul peak (same dtype) it reaches, and the precision
`--precision auto` picks here. Defaults: the configuration pop-piano v2 trains with (seq-len 2,048,
batch 2, gated sineSPE, short convolution of 4). The two precisions' steps alternate, and each
figure is the median step, so that a busy or throttled machine slows both alike.

    python benchmarks/train_throughput.py [--steps 6] [--batch-size 2] [--seq-len 2048] [--pe sinespe]

Model FLOPs per token are counted by torch.utils.flop_counter on one forward+backward pass (the
matrix products the implementation really does), so the utilisation is that of this code.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from spemusic import ModelConfig, Performer


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 10) -> float:
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t0)


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
    args = ap.parse_args()
    import statistics

    from spemusic.train import cpu_has_fast_bf16, pick_dtype

    torch.manual_seed(0)
    cfg = ModelConfig.preset("small", vocab_size=589, pe=args.pe, attention=args.attention)
    model = Performer(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(3, 589, (args.batch_size, args.seq_len + 1))
    tokens = args.batch_size * args.seq_len
    with FlopCounterMode(display=False) as counter:
        train_step(model, opt, x, torch.float32)
    flops_per_token = counter.get_total_flops() / tokens
    print(f"small preset ({model.num_parameters() / 1e6:.2f}M parameters), pe={args.pe}, attention={args.attention}, "
          f"short conv {cfg.short_conv}, seq-len {args.seq_len}, batch {args.batch_size}, {torch.get_num_threads()} "
          f"threads; {flops_per_token / 1e6:.1f} MFLOP per token (forward + backward, counted)")
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    times = {name: [] for name in dtypes}
    for name, dtype in dtypes.items():
        train_step(model, opt, x, dtype)  # warm-up
    for _ in range(args.steps):
        for name, dtype in dtypes.items():
            t0 = time.perf_counter()
            train_step(model, opt, x, dtype)
            times[name].append(time.perf_counter() - t0)
    print(f"{'dtype':<6}{'tokens/s':>10}{'matmul peak GFLOP/s':>22}{'achieved GFLOP/s':>19}{'of peak':>9}")
    results = {}
    for name, dtype in dtypes.items():
        tps = tokens / statistics.median(times[name])
        peak = matmul_peak(dtype)
        achieved = flops_per_token * tps
        results[name] = tps
        print(f"{name:<6}{tps:>10.0f}{peak / 1e9:>22.0f}{achieved / 1e9:>19.1f}{achieved / peak:>8.0%}")
    chosen, why = pick_dtype("auto", torch.device("cpu"), cfg, args.batch_size, args.seq_len)
    chosen_name = "bf16" if chosen == torch.bfloat16 else "fp32"
    print(f"--precision auto here: {chosen_name} ({why})")
    if cpu_has_fast_bf16():
        print(f"before auto measured (bf16 on any CPU with bf16 instructions): {results['bf16']:,.0f} tokens/s; "
              f"now {results[chosen_name]:,.0f}, {results[chosen_name] / results['bf16']:.2f}x")


if __name__ == "__main__":
    main()
