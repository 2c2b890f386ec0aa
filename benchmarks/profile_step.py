"""Where the time of one training step goes: each part of the step timed alone at its real shapes
(forward + backward, as many calls as a step makes), fp32 and bf16 autocast side by side, with
the matrix-product FLOPs of each part (torch.utils.flop_counter) and the share of this machine's
matmul peak (a 2048³ product in the same dtype) it reaches. The parts should add up to about the
full step; "not in a part" is the rest (residual adds, autograd bookkeeping, gradient zeroing).

    python benchmarks/profile_step.py [--preset small] [--seq-len 2048] [--batch-size 2] [--reps 3]

Defaults: the configuration pop-piano v2 trains with. The regions training compiles (the sineSPE
filter's tiles, FAVOR+'s features with the chunked attention, the short convolution) are compiled
here too, and the chunk products run in bf16 under autocast, as in training.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from spemusic import ModelConfig, Performer
from spemusic.nn.attention import favor_attention_training
from spemusic.nn.compiled import compiled
from spemusic.nn.fused import norm_linear
from spemusic.nn.model import short_conv
from spemusic.training.train import build_optimizer

from train_throughput import matmul_peak  # (benchmarks/, the script's own folder)

_LEAVES: dict = {}


def leaf(*shape, name: str = ""):
    """An input that needs a gradient, made once (drawing random numbers is no part of a step)."""
    key = (name, shape)
    if key not in _LEAVES:
        _LEAVES[key] = torch.randn(*shape).requires_grad_()
    x = _LEAVES[key]
    x.grad = None
    return x


def backward(*outs):
    torch.autograd.backward(list(outs), [torch.ones_like(o) for o in outs])


def parts(model: Performer, B: int, T: int):
    """(name, calls per step, fn): fn runs one call's forward and backward."""
    cfg, blk = model.cfg, model.blocks[0]
    H, D, d, V = cfg.n_heads, cfg.d_head, cfg.d_model, cfg.vocab_size
    att, dk = blk.attn, blk.attn.dk
    ids = torch.randint(0, V, (B, T + 1))
    spe = model.spe[0] if model.spe is not None else None
    out = []

    def linears():
        x = leaf(B, T, d)
        qkv = norm_linear(x, blk.ln1, att.qkv.weight, att.qkv.bias)
        o = att.out(leaf(B, T, d, name="o"))
        y = blk.ffn(x)
        backward(qkv, o, y)
    out.append(("linear layers and their norms (qkv, out, FFN)", cfg.n_layers, linears))

    if spe is not None:
        code = spe.draw(None)

        def features():  # values only: the filter returns the frequencies' and phases' gradients
            spe.context(code, 0, T)
        out.append(("sineSPE trig features (shared by the layers)", len(model.spe), features))
        ctx = spe.context(code, 0, T)
        ctx = type(ctx)(**{**ctx.__dict__, "omega": ctx.omega.detach().requires_grad_(),
                                     "theta": ctx.theta.detach().requires_grad_()})  # the phases learn

        def spe_filter():
            backward(*att.filter(leaf(B, T, H, D, name="q"), leaf(B, T, H, D, name="k"), ctx))
        out.append(("sineSPE filter of q and k", cfg.n_layers, spe_filter))

    om = att.scaled_omega()

    def attention():  # as in training: a compiled region each way
        mm_dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        with torch.autocast("cpu", enabled=False):
            o, _ = favor_attention_training(leaf(B, H, T, dk, name="q"), leaf(B, H, T, dk, name="k") * 0.3,
                                            leaf(B, H, T, D, name="v"), omega=om, scale2=dk ** -0.5,
                                            chunk_size=cfg.chunk_size, mm_dtype=mm_dtype)
        backward(o)
    out.append((f"FAVOR+ φ(q̂), φ(k̂), chunked attention ({cfg.chunk_size})", cfg.n_layers, attention))

    if cfg.short_conv:
        def shift():
            backward(compiled(short_conv)(leaf(B, T, d), blk.shift))  # as in training
        out.append((f"short convolution ({cfg.short_conv} tokens)", cfg.n_layers, shift))

    def head():
        x, *_ = model.embed(ids[:, :-1], 0)
        logits = model.head(x + leaf(B, T, d, name="h"))
        F.cross_entropy(logits.float().reshape(-1, V), ids[:, 1:].reshape(-1)).backward()
    out.append(("embedding, output head and loss", 1, head))
    return out


def time_it(fn, dtype, reps: int) -> float:
    def once():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            fn()
    once()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        once()
        best = min(best, time.perf_counter() - t0)
    return best


def flops(fn) -> float:
    with torch._dynamo.config.patch(disable=True), FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--short-conv", type=int, default=24, help="pop-piano v2's (c24 candidate) is 24")
    args = ap.parse_args()
    torch.manual_seed(0)
    B, T = args.batch_size, args.seq_len
    model = Performer(ModelConfig.preset(args.preset, vocab_size=589, short_conv=args.short_conv)).train()
    for b in model.blocks:  # non-zero, as after training (the cost does not depend on it)
        if b.shift is not None:
            b.shift.data.normal_(0, 0.1)
    opt = build_optimizer(model, 1e-4, 0.1, torch.device("cpu"))
    ids = torch.randint(0, 589, (B, T + 1))

    def full_step():
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, 589), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    loss = F.cross_entropy(model(ids[:, :-1]).reshape(-1, 589), ids[:, 1:].reshape(-1))
    loss.backward()

    def optimizer():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    rows = [(name, calls, fn) for name, calls, fn in parts(model, B, T)] + [("AdamW and gradient clipping", 1, optimizer)]
    peaks = {dt: matmul_peak(dt) for dt in (torch.float32, torch.bfloat16)}
    print(f"{args.preset} preset, seq-len {T}, batch {B}, {torch.get_num_threads()} threads; "
          f"matmul peak fp32 {peaks[torch.float32] / 1e9:.0f}, bf16 {peaks[torch.bfloat16] / 1e9:.0f} GFLOP/s")
    head = f"{'part of the step (forward + backward)':<48}{'calls':>6}{'GFLOP':>8}"
    head += "".join(f"{n + ' ms':>10}{'share':>7}{'of peak':>8}" for n in ("fp32", "bf16"))
    print(head)
    results, totals = [], {torch.float32: 0.0, torch.bfloat16: 0.0}
    for name, calls, fn in rows:
        g = flops(fn) * calls
        times = {dt: time_it(fn, dt, args.reps) * calls for dt in totals}
        results.append((name, calls, g, times))
    full = {dt: time_it(full_step, dt, args.reps) for dt in totals}
    for name, calls, g, times in results:
        line = f"{name:<48}{calls:>6}{g / 1e9:>8.1f}"
        for dt, t in times.items():
            totals[dt] += t
            line += f"{t * 1e3:>10.0f}{t / full[dt]:>7.0%}" + (f"{g / t / peaks[dt]:>8.0%}" if g else f"{'':>8}")
        print(line)
    g_all = flops(full_step)
    rest = "".join(f"{(full[dt] - totals[dt]) * 1e3:>10.0f}{(full[dt] - totals[dt]) / full[dt]:>7.0%}{'':>8}" for dt in totals)
    print(f"{'not in a part':<48}{'':>6}{'':>8}{rest}")
    line = f"{'full step':<48}{'':>6}{g_all / 1e9:>8.1f}"
    line += "".join(f"{full[dt] * 1e3:>10.0f}{'100%':>7}{g_all / full[dt] / peaks[dt]:>8.0%}" for dt in totals)
    print(line)
    print("tokens/s: " + ", ".join(f"{n} {B * T / full[dt]:,.0f}"
                                   for n, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16))))


if __name__ == "__main__":
    main()
