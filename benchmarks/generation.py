"""Generation speed: ms per token, side by side, `small` preset, batch 1.

* favor (recurrent step, sinespe) at positions 1k, 4k, 8k, 16k, 64k: the state
  is fast-forwarded by setting ``state.position`` (the step cost does not
  depend on the state's contents: S is a fixed-size (B, H, M, D+1) tensor);
* softmax (KV cache, pe none = a plain GPT) at the same positions: the cache is
  filled with random keys/values of that length (cost independent of values);
* re-running the whole prefix for each token (what the original research
  code did): spemusic favor forward over P tokens, and performer-pytorch's
  PerformerLM when installed, at 256, 1k, 4k.

Each favor and softmax point is measured twice: with the step's linear weights in fp32 (exact)
and in fp16 (what `spemusic generate` uses by default; see benchmarks/step_precision.py for
what it changes: nothing measurable in NLL), and the ratio softmax / favor is taken at the same
precision. Also prints, per precision, the ms/token bound at this CPU's measured
matrix-vector rate (the model's own Linear layers at batch 1: cache-hot, each weight 20
times in a row; and streamed, each weight once as in a step) and the fraction achieved.

    python benchmarks/generation.py [--threads N] [--steps 200] [--compare REV]

--compare REV: the favor step's ms/token (fp32 and fp16 weights, positions 1k and 16k) for the
code of git revision REV (a temporary worktree) and for this tree, in alternating subprocesses (3
rounds each; the best round counts), side by side with the ratio.
"""
from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from spemusic import ModelConfig, Performer  # (also in a revision from before the package's folders)

from revision import REPO, checkout, run_json  # (benchmarks/, the script's own folder)

VOCAB = 400


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_steps(model, state, n):
    x = torch.zeros(state.batch_size, dtype=torch.long)
    for _ in range(10):
        model.step(state, x)
    t0 = time.perf_counter()
    for _ in range(n):
        model.step(state, x)
    return (time.perf_counter() - t0) / n * 1e3


def step_flops(cfg: ModelConfig) -> float:
    """FLOPs of one favor+sinespe recurrent step at batch 1."""
    d, H, D, R, M, K = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.n_realizations, cfg.n_features, cfg.n_sines
    per_layer = 2 * (3 * d * d + d * d + 2 * d * cfg.d_ff)  # linears
    per_layer += 2 * (2 * H) * (2 * D) * R  # gated SPE filter (q and k)
    per_layer += 2 * (2 * H) * R * M  # FAVOR+ projections
    per_layer += 2 * 2 * H * M * (D + 1)  # state update + readout
    shared = 2 * H * D * 2 * (2 * K) * R  # code at position t
    return cfg.n_layers * per_layer + shared + 2 * d * cfg.vocab_size


def matvec_rate(model, repeat: int = 1, dtype=torch.float32) -> float:
    """GFLOP/s of the model's Linear layers (+ head) applied to one vector, in order, with weights
    in `dtype` (the head stays fp32, as in the step).

    repeat=1: each weight once per pass, as in a step (the weights stream from L3/memory);
    repeat=20: each weight 20 times in a row (cache-hot: the kernel's own rate)."""
    lins = [(m.weight.detach().to(dtype), m.bias.detach().to(dtype)) for m in model.modules()
            if isinstance(m, torch.nn.Linear)]
    xs = {w.shape[1]: torch.randn(1, w.shape[1], dtype=dtype) for w, _ in lins}
    head = model.tok.weight
    xh = torch.randn(1, head.shape[1])

    def run():
        for w, b in lins:
            for _ in range(repeat):
                F.linear(xs[w.shape[1]], w, b)
        for _ in range(repeat):
            F.linear(xh, head)

    for _ in range(20):
        run()
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        run()
    dt = (time.perf_counter() - t0) / n
    flops = 2 * repeat * (sum(w.numel() for w, _ in lins) + head.numel())
    return flops / dt / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1, help="torch threads (batch-1 steps are latency-bound)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--positions", type=int, nargs="+", default=[1024, 4096, 8192, 16384, 65536])
    ap.add_argument("--rerun", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--compare", metavar="REV", help="the favor step of git revision REV and of this tree, side by side")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one measurement, for --compare
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.compare:
        return compare(args)
    if args.json:
        return print(json.dumps(favor_step_ms(args.steps)))

    cfg = ModelConfig.preset("small", vocab_size=VOCAB, pe="sinespe", attention="favor")
    fav = Performer(cfg).eval()
    fav.resample(0)
    scfg = ModelConfig.preset("small", vocab_size=VOCAB, pe="none", attention="softmax")
    soft = Performer(scfg).eval()
    print(f"small preset: favor+sinespe {fav.num_parameters()/1e6:.2f}M params, softmax {soft.num_parameters()/1e6:.2f}M; "
          f"threads={args.threads}, batch 1, {args.steps} steps per point")

    dtypes = {"fp32": torch.float32, "fp16": torch.float16}
    with torch.inference_mode():
        bound = {}
        for name, dt in dtypes.items():
            hot = matvec_rate(fav, repeat=20, dtype=dt)
            rate = matvec_rate(fav, dtype=dt)
            bound[name] = step_flops(cfg) / (rate * 1e9) * 1e3
            print(f"{name} weights: matvec rate cache-hot {hot:.1f} GFLOP/s "
                  f"(step bound {step_flops(cfg) / (hot * 1e9) * 1e3:.3f} ms/token), as in a step (each weight once, "
                  f"streamed) {rate:.1f} GFLOP/s (step bound {bound[name]:.3f} ms/token); "
                  f"{step_flops(cfg)/1e6:.1f} MFLOP/token")
        print()

        rows = []
        for P in args.positions:
            row = {"P": P}
            for name, dt in dtypes.items():
                st = fav.init_state(1, weights_dtype=dt)
                st.position = P
                row[f"favor {name}"] = time_steps(fav, st, args.steps)
                row["state MB"] = st.nbytes() / 2**20
                st2 = soft.init_state(1, weights_dtype=dt)
                for kv in st2.layers:
                    kv.append(torch.randn(1, scfg.n_heads, P, scfg.d_head), torch.randn(1, scfg.n_heads, P, scfg.d_head))
                st2.position = P
                row[f"softmax {name}"] = time_steps(soft, st2, args.steps)
                row["KV MB"] = st2.nbytes() / 2**20
                del st2
            rows.append(row)
        print("ms per token (batch 1); ratio = softmax / favor at the same weights precision; bound = the step's "
              "linears at the streamed matvec rate")
        print(f"{'position':>9} {'favor fp32':>11} {'favor fp16':>11} {'softmax fp32':>13} {'softmax fp16':>13} "
              f"{'ratio fp32':>11} {'ratio fp16':>11} {'bound/fp32':>11} {'bound/fp16':>11} {'state MB':>9} {'KV MB':>8}")
        for r in rows:
            print(f"{r['P']:>9} {r['favor fp32']:>11.3f} {r['favor fp16']:>11.3f} {r['softmax fp32']:>13.3f} "
                  f"{r['softmax fp16']:>13.3f} {r['softmax fp32'] / r['favor fp32']:>10.1f}x "
                  f"{r['softmax fp16'] / r['favor fp16']:>10.1f}x {bound['fp32'] / r['favor fp32']:>10.0%} "
                  f"{bound['fp16'] / r['favor fp16']:>10.0%} {r['state MB']:>9.2f} {r['KV MB']:>8.1f}")
        for name in dtypes:
            k = f"favor {name}"
            print(f"{k} ms/token at {rows[-1]['P']} vs {rows[0]['P']}: {rows[-1][k] / rows[0][k]:.2f}x")
        print(f"peak RSS {rss_mb():.0f} MB\n")

        try:
            from performer_pytorch import PerformerLM
        except Exception as e:  # noqa: BLE001 - benchmark-only dependency
            PerformerLM = None
            print(f"(performer-pytorch not installed: {e}; skipping its re-run column)")
        ref = None
        if PerformerLM is not None:
            ref = PerformerLM(num_tokens=VOCAB, max_seq_len=max(args.rerun), dim=cfg.d_model, depth=cfg.n_layers,
                              heads=cfg.n_heads, dim_head=cfg.d_head, causal=True, nb_features=cfg.n_features,
                              ff_mult=cfg.d_ff // cfg.d_model).eval()
        print(f"{'prefix':>7} {'rerun spemusic ms':>18} {'rerun perf-pytorch ms':>22} {'favor fp32 step ms':>19} "
              f"{'speedup vs rerun':>17}")
        for P in args.rerun:
            ids = torch.randint(0, VOCAB, (1, P))
            reps = 3 if P <= 1024 else 1
            fav(ids)
            t0 = time.perf_counter()
            for _ in range(reps):
                fav(ids)
            r_ms = (time.perf_counter() - t0) / reps * 1e3
            p_ms = float("nan")
            if ref is not None:
                ref(ids)
                t0 = time.perf_counter()
                for _ in range(reps):
                    ref(ids)
                p_ms = (time.perf_counter() - t0) / reps * 1e3
            st = fav.init_state(1)
            st.position = P
            f_ms = time_steps(fav, st, args.steps)
            best_rerun = p_ms if p_ms == p_ms else r_ms
            print(f"{P:>7} {r_ms:>18.1f} {p_ms:>22.1f} {f_ms:>19.3f} {best_rerun/f_ms:>16.0f}x")


COMPARE_POSITIONS = (1024, 16384)


def favor_step_ms(steps: int) -> dict:
    """ms/token of the favor+sinespe step of the small preset, per weights dtype and position."""
    fav = Performer(ModelConfig.preset("small", vocab_size=VOCAB, pe="sinespe", attention="favor")).eval()
    fav.resample(0)
    out = {}
    with torch.inference_mode():
        for name, dt in {"fp32": torch.float32, "fp16": torch.float16}.items():
            for P in COMPARE_POSITIONS:
                st = fav.init_state(1, weights_dtype=dt)
                st.position = P
                out[f"{name} @{P}"] = time_steps(fav, st, steps)
    return out


def compare(args) -> None:
    """Alternate subprocesses of REV's code and this tree's, 3 rounds each; print the best of each."""
    best = {"before": {}, "after": {}}
    with checkout(args.compare) as base:
        for _ in range(3):
            for side, root in (("before", base), ("after", REPO)):
                worker = ["--steps", args.steps, "--threads", args.threads]
                for name, ms in run_json(Path(__file__), worker, root).items():
                    best[side][name] = min(best[side].get(name, float("inf")), ms)
    print(f"favor + sineSPE step, small preset, batch 1, {args.threads} thread(s); best of 3 rounds of {args.steps} steps")
    print(f"{'weights @ position':<20}{args.compare + ' ms/token':>22}{'this tree ms/token':>20}{'ratio':>8}")
    for name, b in best["before"].items():
        a = best["after"][name]
        print(f"{name:<20}{b:>22.3f}{a:>20.3f}{a / b:>7.2f}x")


if __name__ == "__main__":
    main()
