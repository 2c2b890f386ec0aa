"""Where a generated token's time goes, as `spemusic generate` runs it with every default on.

Per token, at batch 1: the whole sampling loop, split into the model's recurrent step, the
continuous cache (when its defaults turn it on) and the sampler (grammar mask, nuclei, hole
penalty, stacking, chords, the draw, the bookkeeping). The eager step (Performer.step) alone, its
wall time shared out, as torch.profiler sees its ops, between the matrix products with the
weights, the batched products of the attention state and the SPE codes, and the other ops, with
the number of ops a token dispatches (each costs microseconds of Python and dispatch whatever its
size); the compiled step (spemusic.nn.step_graph) alone, by program. Beside them, the
bound: one row through every linear weight the step reads (the blocks' and the output head's),
in the step's precision, each weight once, as a token must.

    python benchmarks/step_profile.py [--model pop-piano] [--tokens 600] [--threads 1]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from spemusic import load_model
from spemusic.generation.pieces import generate
from spemusic.generation.sampling import _Decoder, auto_step_dtype
from spemusic.nn.model import Performer
from spemusic.nn.step_graph import StepGraph

from _errors import run_script

WEIGHT_PRODUCTS = {"aten::addmm", "aten::mm", "aten::matmul", "aten::linear"}
STATE_PRODUCTS = {"aten::bmm", "aten::baddbmm", "aten::baddbmm_"}


def _timed(owner, name: str, spent: dict):
    """Wrap owner.name so that its calls' wall time adds up in spent[name]; returns the original."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - t0
            spent[name + " calls"] += 1

    setattr(owner, name, wrapper)
    return original


def loop_split(model, tok, tokens: int, seed: int) -> dict:
    """ms per token of the whole loop, the step, the decoder around it (the cache: its mixing and
    its memory) and the rest (the sampler)."""
    generate(model, tok, length=2, seed=seed)  # the compiled step loaded (or compiled, once) before the clock
    spent = defaultdict(float)
    originals = [(owner, name, _timed(owner, name, spent))
                 for owner, name in ((Performer, "step"), (StepGraph, "__call__"), (_Decoder, "next_log_probs"),
                                     (_Decoder, "feed"))]
    try:
        t0 = time.perf_counter()
        pieces = generate(model, tok, length=tokens, seed=seed)
        total = time.perf_counter() - t0
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
    decoder = spent["next_log_probs"] + spent["feed"]
    step = spent["step"] + spent["__call__"]
    per = 1e3 / max(1, spent["step calls"] + spent["__call__ calls"])
    return {"tokens": pieces.result.new_tokens, "loop": total * per, "step": step * per,
            "cache": (decoder - step) * per, "sampler": (total - decoder) * per,
            "compiled": spent["__call__ calls"] > 0}


def compiled_split(model, tokens: int, dtype: torch.dtype) -> dict | None:
    """ms per token of the compiled step alone and of its programs (None: not compiled here)."""
    ids = torch.randint(5, 300, (1, 32))
    with torch.inference_mode():
        _, state = model.prime(ids, weights_dtype=dtype)
        graph = StepGraph.of(model, state)
        if graph is None:
            return None
        nxt = ids[:, -1]
        for _ in range(20):
            graph(state, nxt)

        def ms(fn) -> float:
            t0 = time.perf_counter()
            for _ in range(tokens):
                fn()
            return (time.perf_counter() - t0) * 1e3 / tokens

        out = {"step": ms(lambda: graph(state, nxt)), "input": ms(graph.input.run),
               "layers": sum(ms(layer.run) for layer in graph.layers), "head": ms(graph.head.run)}
    out["around"] = out["step"] - out["input"] - out["layers"] - out["head"]
    return out


def step_split(model, tokens: int, dtype: torch.dtype) -> dict:
    """ms per token of the step alone (unprofiled), and its profiled ops by kind."""
    ids = torch.randint(5, 300, (1, 32))
    with torch.inference_mode():
        _, state = model.prime(ids, weights_dtype=dtype)
        nxt = ids[:, -1]
        for _ in range(20):
            _, state = model.step(state, nxt)
        t0 = time.perf_counter()
        for _ in range(tokens):
            _, state = model.step(state, nxt)
        wall = (time.perf_counter() - t0) * 1e3 / tokens
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(tokens):
                _, state = model.step(state, nxt)
    kinds, ops = defaultdict(float), 0
    for e in prof.key_averages():
        kind = "weights" if e.key in WEIGHT_PRODUCTS else "state" if e.key in STATE_PRODUCTS else "other"
        kinds[kind] += e.self_cpu_time_total
        ops += e.count
    profiled = sum(kinds.values())
    return {"step": wall, "ops": ops / tokens, **{k: wall * v / profiled for k, v in kinds.items()}}


def weight_bound(model, dtype: torch.dtype, reps: int = 200) -> float:
    """ms to pass one row through every linear weight the step reads, each once, in `dtype`."""
    weights = [m.weight.detach().to(dtype).contiguous() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    weights.append(model.tok.weight.detach().to(dtype).contiguous())  # the output head
    rows = [torch.randn(1, w.shape[1], dtype=dtype) for w in weights]
    for _ in range(10):
        for x, w in zip(rows, weights):
            F.linear(x, w)
    t0 = time.perf_counter()
    for _ in range(reps):
        for x, w in zip(rows, weights):
            F.linear(x, w)
    return (time.perf_counter() - t0) * 1e3 / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pop-piano")
    ap.add_argument("--tokens", type=int, default=600)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model)
    dtype = auto_step_dtype("cpu", 1)
    loop = loop_split(model, tok, args.tokens, args.seed)
    step = step_split(model, args.tokens, dtype)
    graph = compiled_split(model, args.tokens, dtype)
    bound = weight_bound(model, dtype)
    n_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)) + model.tok.weight.numel()
    print(f"{args.model}, batch 1, {args.threads} thread(s), step weights {str(dtype).removeprefix('torch.')}, "
          f"generate's defaults, {loop['tokens']} tokens")
    rows = [
        ("the whole loop (generate)", loop["loop"]),
        ("  the model's step" + (" (compiled)" if loop["compiled"] else f" (eager: {StepGraph.unavailable()})"),
         loop["step"]),
        ("  the decoder around it (the continuous cache)", loop["cache"]),
        ("  the sampler (masks, nuclei, steering, draw)", loop["sampler"]),
        ("the eager step (Performer.step) alone, teacher-forced", step["step"]),
        ("  products with the weights (addmm, mm)", step["weights"]),
        ("  attention state and SPE products (bmm)", step["state"]),
        (f"  other ops (norms, φ, adds, copies; {step['ops']:.0f} ops a token in all)", step["other"]),
    ]
    if graph is not None:
        rows += [("the compiled step (StepGraph) alone, teacher-forced", graph["step"]),
                 ("  input: embedding, bar echo, SPE code", graph["input"]),
                 (f"  {len(model.blocks)} layers", graph["layers"]),
                 ("  head", graph["head"]),
                 ("  the rest: weights read cold, Python between the programs", graph["around"])]
    rows.append((f"bound: one row through {n_weights / 1e6:.1f}M weights", bound))
    for name, ms in rows:
        print(f"{name:<64}{ms:>8.3f} ms/token")
    print(f"{'the loop / the bound':<64}{loop['loop'] / bound:>8.1f}x")
    print("(the step's wall time is shared out in the proportions the profiled ops take)")


if __name__ == "__main__":
    run_script(main)
