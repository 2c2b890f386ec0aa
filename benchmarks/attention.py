"""Training-step throughput and peak memory, side by side (fresh process per point).

Configurations (`small` preset sizes unless --layers/--d-model are given):
spemusic favor+sinespe (chunked causal linear attention), the same with
activation checkpointing (`--checkpoint-activations`: block activations
recomputed in the backward pass), optionally spemusic favor without a positional
encoding (`--impls ... spemusic-favor-nope`: the attention paths compared, as
performer-pytorch's default positional encoding is rotary, an elementwise
rotation of q and k, not SPE), performer-pytorch's
PerformerLM (causal; benchmark-only dependency, skipped with a note if not
installed) and spemusic softmax (SDPA). Sequence lengths 512..8192 with the
batch chosen to keep ~8k tokens per step. A step = forward + cross-entropy +
backward + AdamW update. Peak memory = peak RSS of the child process.

Also prints training FLOP utilisation: model FLOPs per token (3 x the forward's: 2 x matmul
parameters + the attention and sineSPE terms, for forward + backward) x tokens/s divided by a
measured fp32 matmul peak, and (fp32) a ceiling table: spemusic favor's tokens/s if every
model FLOP ran at that peak, the FLOP utilisation 3x performer-pytorch's speed would need, and the
rate the model's dense GEMMs themselves reach at the step's shapes.

    python benchmarks/attention.py [--lens 512 2048 8192] [--steps 3] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

TOKENS = 8192
VOCAB = 400


def model_flops_per_token(impl: str, T: int, L: int, d: int, dff: int, H: int, M: int, R: int, C: int = 128) -> float:
    """Training FLOPs per token (forward x3)."""
    D = d // H
    dense = 2 * (4 * d * d + 2 * d * dff) + 2 * d * VOCAB / L
    if impl == "softmax":
        att = 2 * 2 * (T / 2) * d  # causal QK^T and AV, average context T/2
    else:
        spe = impl.startswith("spemusic-favor") and impl != "spemusic-favor-nope"
        dk = R if spe else D
        att = H * (2 * dk * M * 2 + 2 * C * (M + D + 1) + 2 * 2 * M * (D + 1))
        if spe:
            att += 2 * 2 * H * D * 10 * R  # sineSPE filter, 5 sines
    return 3 * L * (dense + att)


def child(args):
    import resource

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    T = args.len
    B = max(1, TOKENS // T)
    if args.impl == "performer-pytorch":
        from performer_pytorch import PerformerLM

        model = PerformerLM(num_tokens=VOCAB, max_seq_len=T, dim=args.d_model, depth=args.layers, heads=args.heads,
                            dim_head=args.d_model // args.heads, causal=True, nb_features=args.features,
                            ff_mult=args.d_ff // args.d_model)
    else:
        from spemusic.nn.model import ModelConfig, Performer

        att = "softmax" if args.impl == "spemusic-softmax" else "favor"
        pe = "none" if args.impl in ("spemusic-softmax", "spemusic-favor-nope") else "sinespe"
        cfg = ModelConfig.preset("small", vocab_size=VOCAB, n_layers=args.layers, d_model=args.d_model,
                                 n_heads=args.heads, d_ff=args.d_ff, attention=att, pe=pe, n_features=args.features,
                                 n_realizations=64, max_len=max(T, 2048))
        model = Performer(cfg)
        model.checkpoint_activations = args.impl == "spemusic-favor-ckpt"
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, VOCAB, (B, T + 1))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            logits = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"tok_s": B * T / med, "peak_mb": peak}))


def gflops(run, flops_per_run: float, warmup: int, n: int) -> float:
    """GFLOP/s of ``run()`` over n timed calls after warm-up calls."""
    for _ in range(warmup):
        run()
    t0 = time.perf_counter()
    for _ in range(n):
        run()
    return flops_per_run * n / (time.perf_counter() - t0) / 1e9


def matmul_peak(threads: int) -> float:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    return gflops(lambda: a @ b, 2 * 1024**3, warmup=3, n=10)


def dense_gemm_rate(threads: int, d: int, dff: int, rows: int = TOKENS) -> float:
    """GFLOP/s of one layer's dense products (qkv, out, FFN in and out) at the step's shapes,
    forward and both backward products: what GEMM-bound work reaches here in practice."""
    import torch

    torch.set_num_threads(threads)
    shapes = [(d, 3 * d), (d, d), (d, dff), (dff, d)]
    xs = [torch.randn(rows, i) for i, _ in shapes]
    ws = [torch.randn(o, i) for i, o in shapes]

    def layer():
        for x, w in zip(xs, ws):
            y = x @ w.T
            y @ w  # grad of x
            y.T @ x  # grad of w

    return gflops(layer, sum(3 * 2 * rows * i * o for i, o in shapes), warmup=2, n=5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--d-ff", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: forward and loss under CPU bf16 autocast, for every configuration")
    ap.add_argument("--impls", nargs="+", default=["spemusic-favor", "spemusic-favor-ckpt", "performer-pytorch",
                                                           "spemusic-softmax"])
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--len", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.impl = args.child
        return child(args)

    impls = list(args.impls)
    if "performer-pytorch" in impls:
        try:
            import performer_pytorch  # noqa: F401
        except Exception as e:  # noqa: BLE001 - benchmark-only dependency: whatever stops its import skips it
            print(f"note: performer-pytorch not installable/importable ({e}); skipping it")
            impls.remove("performer-pytorch")
    peak = matmul_peak(args.threads)
    print(f"{args.layers} layers, d_model {args.d_model}, {args.heads} heads, d_ff {args.d_ff}, {args.features} "
          f"features, ~{TOKENS} tokens/step, threads={args.threads}, {args.precision}; measured fp32 matmul peak "
          f"{peak:.0f} GFLOP/s (MFU below is relative to it{', also under bf16' if args.precision == 'bf16' else ''})\n")
    res = {}
    for T in args.lens:
        for impl in impls:
            cmd = [sys.executable, __file__, "--child", impl, "--len", str(T), "--steps", str(args.steps),
                   "--threads", str(args.threads), "--layers", str(args.layers), "--d-model", str(args.d_model),
                   "--d-ff", str(args.d_ff), "--heads", str(args.heads), "--features", str(args.features),
                   "--precision", args.precision]
            p = subprocess.run(cmd, capture_output=True, text=True)
            line = [out for out in p.stdout.splitlines() if out.startswith("{")]
            if p.returncode or not line:
                print(f"  {impl} @ {T}: failed ({p.stderr.strip().splitlines()[-1:] if p.stderr else p.returncode})")
                continue
            res[(impl, T)] = json.loads(line[-1])
            r = res[(impl, T)]
            mfu = model_flops_per_token(impl, T, args.layers, args.d_model, args.d_ff, args.heads, args.features,
                                        R=64, C=64) * r["tok_s"] / (peak * 1e9)  # the small preset's R and chunk
            r["mfu"] = mfu
            print(f"  {impl:>18} @ {T:>5}: {r['tok_s']:8.0f} tok/s  peak {r['peak_mb']:7.0f} MB  MFU {mfu:5.1%}",
                  flush=True)
    print("\nratios in this run (favor = spemusic favor+sinespe, ckpt = the same with activation checkpointing, "
          "perf = performer-pytorch, soft = spemusic softmax, nope = spemusic favor without a PE):")
    pairs = [("favor/perf speed", "spemusic-favor", "performer-pytorch", "tok_s"),
             ("favor/perf mem", "spemusic-favor", "performer-pytorch", "peak_mb"),
             ("ckpt/perf speed", "spemusic-favor-ckpt", "performer-pytorch", "tok_s"),
             ("ckpt/perf mem", "spemusic-favor-ckpt", "performer-pytorch", "peak_mb"),
             ("favor/soft speed", "spemusic-favor", "spemusic-softmax", "tok_s"),
             ("ckpt/soft speed", "spemusic-favor-ckpt", "spemusic-softmax", "tok_s"),
             ("nope/perf speed", "spemusic-favor-nope", "performer-pytorch", "tok_s")]
    pairs = [p for p in pairs if any((p[1], T) in res and (p[2], T) in res for T in args.lens)]
    print(f"{'len':>5} " + " ".join(f"{name:>17}" for name, *_ in pairs))
    for T in args.lens:
        cells = []
        for _, a, b, key in pairs:
            ra, rb = res.get((a, T)), res.get((b, T))
            cells.append(f"{ra[key] / rb[key]:>16.2f}x" if ra and rb else f"{'-':>17}")
        print(f"{T:>5} " + " ".join(cells))

    # How far 3x performer-pytorch is from what the FLOPs allow: the ceiling is spemusic favor's model
    # FLOPs at the measured peak (MFU 100%); the dense layers' GEMMs are what matmuls reach in practice.
    if args.precision == "fp32" and any(("spemusic-favor", T) in res and ("performer-pytorch", T) in res
                                        for T in args.lens):
        dense = dense_gemm_rate(args.threads, args.d_model, args.d_ff)
        print(f"\nceiling: one layer's dense GEMMs (forward + backward, {TOKENS} rows) run at {dense:.0f} GFLOP/s "
              f"= {dense / peak:.0%} of the matmul peak, in fp32")
        print(f"{'len':>5} {'favor tok/s':>12} {'at 100% MFU':>12} {'3x perf':>9} {'MFU needed':>11}")
        for T in args.lens:
            f, pp = res.get(("spemusic-favor", T)), res.get(("performer-pytorch", T))
            if f and pp:
                ceiling = f["tok_s"] / f["mfu"]
                print(f"{T:>5} {f['tok_s']:>12.0f} {ceiling:>12.0f} {3 * pp['tok_s']:>9.0f} "
                      f"{3 * pp['tok_s'] / ceiling:>11.0%}")


if __name__ == "__main__":
    main()
