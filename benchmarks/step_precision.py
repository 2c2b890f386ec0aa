"""What half-precision step weights change: the shipped models scored token by token on real
validation pieces, through the recurrent step with fp32, fp16 and bf16 linear weights, against
the parallel (chunked) fp32 forward pass.

Prints, per model: mean NLL per token of each path, the largest logit difference from the
parallel pass, the mean KL divergence from the parallel pass's next-token distribution, and how
often the most likely token differs.

    python benchmarks/step_precision.py [--pieces 8] [--tokens 1024]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from spemusic.nn.checkpoint import load_model
from spemusic.training.data import open_dataset

from _errors import run_script  # (benchmarks/, the script's own folder)

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MODELS = {"pop-piano": DATA / "pop909", "groove": DATA / "groove"}


def step_logits(model, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    st = model.init_state(ids.shape[0], weights_dtype=dtype)
    out = []
    for t in range(ids.shape[1]):
        logits, st = model.step(st, ids[:, t])
        out.append(logits)
    return torch.stack(out, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pieces", type=int, default=8, help="validation pieces per model")
    ap.add_argument("--tokens", type=int, default=1024, help="tokens scored per piece")
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"{'model':>10} {'path':>22} {'NLL/token':>10} {'max |Δlogit|':>13} {'mean KL':>9} {'top-1 differs':>14}")
    for name, data in MODELS.items():
        model, tok = load_model(name)
        model.resample(0)
        seqs = [s for s in open_dataset(data, tok.config).sequences("valid") if len(s) > args.tokens]
        picks = np.linspace(0, len(seqs) - 1, num=min(args.pieces, len(seqs))).round().astype(int)
        x = torch.from_numpy(np.stack([np.asarray(seqs[i][: args.tokens + 1], dtype=np.int64) for i in picks]))
        inp, tgt = x[:, :-1], x[:, 1:]
        with torch.inference_mode():
            ref = model(inp).float()
            rows = [("parallel fp32", ref)]
            rows.append(("step, fp32 weights", step_logits(model, inp, torch.float32)))
            rows.append(("step, fp16 weights", step_logits(model, inp, torch.float16)))
            rows.append(("step, bf16 weights", step_logits(model, inp, torch.bfloat16)))
        ref_logp = F.log_softmax(ref.double(), -1)  # float64: KL values this small
        for label, lg in rows:
            nll = F.cross_entropy(lg.transpose(1, 2), tgt).item()
            logp = F.log_softmax(lg.double(), -1)
            kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1).mean().item()
            diff = (lg - ref).abs().max().item()
            top1 = (lg.argmax(-1) != ref.argmax(-1)).float().mean().item()
            print(f"{name:>10} {label:>22} {nll:>10.5f} {diff:>13.2e} {kl:>9.1e} {top1:>13.3%}")
        print(f"{'':>10} ({len(picks)} validation pieces x {args.tokens} tokens, {data.name})")


if __name__ == "__main__":
    run_script(main)
