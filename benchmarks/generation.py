"""Generation speed, the whole sampling loop and the step alone, side by side in one run.

Default: pop-piano with every default of `spemusic generate`, batch 1, on the code before the
compiled step (OLD, a temporary worktree: the eager step) and on this tree (the compiled step
where this machine can compile it), in alternating fresh processes, 2 rounds each (the best
counts), at 1 and 2 threads:
* ms/token of the loop after a prompt of 1k and 64k tokens (a tiled example piece; memory over
  a long piece: benchmarks/generate_long.py);
* the weight-read bound measured here: one row through every linear weight the step reads (the
  blocks' and the head's), in the step's precision (fp16), each weight once, as a token must;
* from scratch, tokens/s at batch 8 against batch 1 (each side's own auto precision; 2,400 and
  8 x 600 tokens);
* a model twice `small`'s width with twice its layers (random weights, pop-piano's vocabulary and
  defaults): its ms/token and how far ahead of real time that plays at pop-piano's tokens per
  second of music (measured on the 2,400-token pop-piano pieces of this run);
* the agreement of the two steps: the KL divergence of the next-token distributions, eager
  against compiled, on 1,000 teacher-forced positions of a real-sized piece (pop-piano's own).

    python benchmarks/generation.py [--old REV] [--threads 1 2] [--tokens 600]   # ~10 min
    python benchmarks/generation.py --attention [--threads N] [--steps 200] [--compare REV]

--attention: the FAVOR+ step against a softmax KV cache and against re-running the prefix, at
positions 1k to 64k (`small` preset, random weights):
* favor (recurrent step, sinespe) at positions 1k, 4k, 8k, 16k, 64k: the state
  is fast-forwarded by setting ``state.position`` (the step cost does not
  depend on the state's contents: S is a fixed-size (B, H, M, D+1) tensor);
* softmax (KV cache, pe none = a plain GPT) at the same positions: the cache is
  filled with random keys/values of that length (cost independent of values);
* re-running the whole prefix for each token (what the original research
  code did): spemusic favor forward over P tokens, and performer-pytorch's
  PerformerLM when installed, at 256, 1k, 4k.

Each favor and softmax point is measured twice: with the step's linear weights in fp32 (exact)
and in fp16, and the ratio softmax / favor is taken at the same precision. Also prints, per
precision, the ms/token bound at this CPU's measured matrix-vector rate and the fraction
achieved. --compare REV: the favor step's ms/token (fp32 and fp16 weights, positions 1k and 16k)
for the code of git revision REV and for this tree, in alternating subprocesses (3 rounds each;
the best round counts), side by side with the ratio.
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

from revision import OLD, REPO, checkout, run_json  # (benchmarks/, the script's own folder)

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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attention", action="store_true", help="FAVOR+ against softmax and re-running (see above)")
    ap.add_argument("--old", default=OLD, metavar="REV", help=f"the old path's revision [default: {OLD}]")
    ap.add_argument("--threads", type=int, nargs="+", default=None,
                    help="torch threads [default: 1 and 2; --attention: 1]")
    ap.add_argument("--tokens", type=int, default=600, help="tokens sampled per measurement")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--positions", type=int, nargs="+", default=None)
    ap.add_argument("--rerun", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--compare", metavar="REV", help="--attention: the favor step of git revision REV and of this "
                    "tree, side by side")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one measurement, in a subprocess
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="pop-piano", help=argparse.SUPPRESS)
    ap.add_argument("--num", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.worker:
        return print(json.dumps(WORKERS[args.worker](args)))
    if not args.attention:
        return loop_study(args)
    args.threads = (args.threads or [1])[0]
    args.positions = args.positions or [1024, 4096, 8192, 16384, 65536]
    torch.set_num_threads(args.threads)
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
BIG = dict(d_model=512, n_layers=12, d_ff=2048, n_heads=8)  # twice small's width, twice its layers


def tiled_prompt(tok, length: int):
    """[BOS] and the example piano piece's bars over and over, `length` tokens in all."""
    import numpy as np

    ids = tok.encode(REPO / "data" / "examples" / "piano.mid")
    body = ids[1:-1] if ids[-1] == tok.eos_id else ids[1:]
    return np.concatenate([ids[:1], np.resize(body, length - 1)]).astype(np.int64)


def _load(name: str):
    from spemusic.generation.settings import SamplingOptions
    from spemusic.nn.checkpoint import load_model

    if name == "big":  # random weights in pop-piano's vocabulary, sampled with pop-piano's defaults
        pop, tok = load_model("pop-piano")
        torch.manual_seed(0)
        model = Performer(ModelConfig.from_dict({**pop.cfg.to_dict(), **BIG})).eval()
        return model, tok, SamplingOptions.for_model("pop-piano", own=pop.sampling_defaults)
    model, tok = load_model(name)
    return model, tok, SamplingOptions.for_model(name, own=model.sampling_defaults)


def loop_worker(args) -> dict:
    """ms/token of `sample` after prompts of each position, and the memory around it (one process)."""
    from spemusic.generation.sampling import sample

    torch.set_num_threads(args.threads[0])
    model, tok, options = _load(args.model)
    out = {}
    for P in args.positions:
        prompt = tiled_prompt(tok, P)
        r = sample(model, tok, num=args.num, length=args.tokens, seed=1, prompt=prompt, options=options)
        music = sum(_seconds(tok, ids) for ids in r.ids) - (args.num * _seconds(tok, prompt) if P > 1 else 0.0)
        out[P] = {"ms": r.wall_seconds / r.new_tokens * 1e3, "tok_s": r.new_tokens * args.num / r.wall_seconds,
                  "music_s": music,
                  "tokens": sum(len(ids) - len(prompt) for ids in r.ids)}
    return out


def _seconds(tok, ids) -> float:
    """Seconds of music in a piece's tokens (its MIDI's end time)."""
    import numpy as np  # (numpy's import is the worker's, not the parent's)

    midi = tok.decode(np.asarray(ids))
    return float(midi.get_tick_to_time_mapping()[midi.max_tick])


WORKERS = {"loop": loop_worker}


def _worker(root, model: str, threads: int, positions, tokens: int, num: int = 1) -> dict:
    return {int(k): v for k, v in run_json(Path(__file__), ["--worker", "loop", "--model", model, "--threads", threads,
                                                              "--positions", *positions, "--tokens", tokens,
                                                              "--num", num], root).items()}


def weight_read_ms(model, dtype=torch.float16, repeat: int = 200) -> float:
    """One row through every linear weight the step reads (the blocks' in `dtype`, the head's in
    fp32, as the step keeps it), each once, in order: the best of 5 rounds, ms."""
    lins = [(m.weight.detach().to(dtype), m.bias.detach().to(dtype)) for m in model.modules()
            if isinstance(m, torch.nn.Linear)] + [(model.tok.weight.detach(), None)]
    xs = [torch.randn(1, w.shape[1], dtype=w.dtype) for w, _ in lins]
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat):
            for x, (w, b) in zip(xs, lins):
                F.linear(x, w, b)
        best = min(best, (time.perf_counter() - t0) / repeat * 1e3)
    return best


def step_agreement(model, tok, positions: int = 1000) -> tuple[float, float]:
    """(mean, max) over `positions` teacher-forced positions of KL(eager ‖ compiled) of the
    next-token distributions, fp16 step weights, after a 1,000-token prompt."""
    from spemusic.nn.step_graph import StepGraph

    ids = torch.from_numpy(tiled_prompt(tok, 1000 + positions))[None]
    model.resample(1)
    with torch.inference_mode():
        _, eager = model.prime(ids[:, :1000], weights_dtype=torch.float16)
        _, state = model.prime(ids[:, :1000], weights_dtype=torch.float16)
        graph = StepGraph.of(model, state)
        if graph is None:
            return float("nan"), float("nan")
        kls = []
        for t in range(1000, 1000 + positions):
            a, eager = model.step(eager, ids[:, t])
            b, state = graph(state, ids[:, t])
            la, lb = a.float().log_softmax(-1), b.float().log_softmax(-1)
            kls.append((la.exp() * (la - lb)).sum().item())
    return sum(kls) / len(kls), max(kls)


def loop_study(args) -> None:
    from spemusic.nn.checkpoint import load_model
    from spemusic.nn.step_graph import StepGraph

    threads = args.threads or [1, 2]
    positions = args.positions or [1024, 65536]
    print(f"the sampling loop, pop-piano with generate's defaults, batch 1, {args.tokens} tokens per point; "
          f"old: {args.old} (the eager step), new: this tree (compiled step: {StepGraph.unavailable() or 'on'}); "
          "best of 2 rounds, alternating fresh processes")
    pop, tok = load_model("pop-piano")
    with checkout(args.old) as old_root:
        best = {}
        for n in threads:
            for _ in range(2):
                for side, root in (("old", old_root), ("new", REPO)):
                    got = _worker(root, "pop-piano", n, positions, args.tokens)
                    for P, r in got.items():
                        key = (n, side, P)
                        if key not in best or r["ms"] < best[key]["ms"]:
                            best[key] = r
        print(f"{'threads':>7} {'position':>9} {'old ms/token':>13} {'new ms/token':>13} {'speedup':>8} "
              f"{'bound ms':>9} {'new/bound':>10}")
        for n in threads:
            torch.set_num_threads(n)
            bound = weight_read_ms(pop)
            for P in positions:
                o, w = best[(n, "old", P)], best[(n, "new", P)]
                print(f"{n:>7} {P:>9} {o['ms']:>13.3f} {w['ms']:>13.3f} {o['ms'] / w['ms']:>7.2f}x {bound:>9.3f} "
                      f"{w['ms'] / bound:>9.2f}x")
            lo, hi = best[(n, "new", positions[0])], best[(n, "new", positions[-1])]
            print(f"{'':>7} new at {positions[-1]} against {positions[0]}: {hi['ms'] / lo['ms']:.2f}x the time")
        torch.set_num_threads(1)
        print(f"\nfrom scratch, 1 thread{'':<12}{'old':>12}{'new':>12}")
        b1 = {s: _worker(r, "pop-piano", 1, [1], 4 * args.tokens, 1)[1] for s, r in (("old", old_root), ("new", REPO))}
        b8 = {s: _worker(r, "pop-piano", 1, [1], args.tokens, 8)[1] for s, r in (("old", old_root), ("new", REPO))}
        # pop-piano's tokens per second of music, from its pieces of 2,400 tokens here (shorter ones
        # from scratch hold fewer: 600 tokens gave 25.5 a second where 240 bars of `play` give 41)
        rate = sum(b["tokens"] for b in b1.values()) / sum(b["music_s"] for b in b1.values())
        print(f"{'batch 1, tokens/s (1 thread)':<34}{b1['old']['tok_s']:>12.0f}{b1['new']['tok_s']:>12.0f}")
        print(f"{'batch 8, tokens/s (1 thread)':<34}{b8['old']['tok_s']:>12.0f}{b8['new']['tok_s']:>12.0f}")
        print(f"{'batch 8 / batch 1':<34}{b8['old']['tok_s'] / b1['old']['tok_s']:>11.2f}x"
              f"{b8['new']['tok_s'] / b1['new']['tok_s']:>11.2f}x")
        print(f"{'pop-piano, tokens a second of music':<34}{rate:>24.1f}")
        big = {}
        for n in threads:
            for s, r in (("old", old_root), ("new", REPO)):
                big[(n, s)] = _worker(r, "big", n, [1], args.tokens // 2)[1]["ms"]
        params = sum(p.numel() for p in Performer(ModelConfig.from_dict({**pop.cfg.to_dict(), **BIG})).parameters())
        for n in threads:
            print(f"{f'{params / 1e6:.0f}M-parameter model, ms/token ({n} thr)':<34}{big[(n, 'old')]:>12.3f}"
                  f"{big[(n, 'new')]:>12.3f}")
            print(f"{'  ahead of real time':<34}{1e3 / big[(n, 'old')] / rate:>11.1f}x{1e3 / big[(n, 'new')] / rate:>11.1f}x")
    mean, worst = step_agreement(pop, tok)
    print(f"\nKL(eager || compiled) of the next-token distributions, 1,000 teacher-forced positions, fp16 "
          f"weights: mean {mean:.2e}, max {worst:.2e}")


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
