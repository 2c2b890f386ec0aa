"""Does a faster training step still learn the same? Short training runs on real POP909 windows
from one initialisation, fp32 and bf16 autocast, for this tree and (with --compare REV) for git
revision REV, side by side: the validation NLL (nats per token) on fixed valid windows after the
same steps. The runs share the model's initialisation, the batches and the SPE draws, so the
differences are the arithmetic's.

    python benchmarks/train_precision.py [--steps 60] [--compare REV] [--data ../shared/data/pop909]

Defaults: the small preset with pop-piano v2's short convolution (24), seq-len 1,024, batch 2,
lr 1e-3 after 10 warmup steps; POP909 re-barred by its beats, with chords (the tokenizer cache that
`spemusic train` makes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / ".." / "shared" / "data" / "pop909"


def run(args) -> dict:
    from spemusic.data import WindowSampler, fixed_windows, open_dataset
    from spemusic.model import ModelConfig, Performer
    from spemusic.train import evaluate_windows, lm_loss

    try:
        from spemusic.train import build_optimizer
    except ImportError:  # a revision from before build_optimizer: its trainer's AdamW
        def build_optimizer(model, lr, wd, device):
            return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=wd)

    data = Path(args.data)
    cache = open_dataset(data, beats_dir=data / "beats", chords_dir=data / "chords")
    tok = cache.tokenizer
    valid = fixed_windows(cache, "valid", args.seq_len, max_windows=16)
    result = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        torch.manual_seed(0)
        model = Performer(ModelConfig.preset("small", vocab_size=len(tok), short_conv=24)).train()
        opt = build_optimizer(model, args.lr, 0.1, torch.device("cpu"))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
        sampler, rng = WindowSampler(cache, "train", args.seq_len), np.random.default_rng(0)
        for _ in range(args.steps):
            batch = torch.from_numpy(sampler.sample(rng, 2).astype(np.int64))
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                loss, _ = lm_loss(model, batch, tok.pad_id)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
        result[name] = evaluate_windows(model, valid, tok.pad_id, torch.device("cpu"), torch.float32)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--compare", metavar="REV")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.json:
        print(json.dumps(run(args)))
        return
    sides = {"this tree": HERE.parent}
    with tempfile.TemporaryDirectory() as tmp:
        if args.compare:
            base = Path(tmp) / "base"
            subprocess.run(["git", "-C", str(HERE.parent), "worktree", "add", "--detach", str(base), args.compare],
                           check=True, capture_output=True)
            sides = {args.compare: base, **sides}
        try:
            results = {}
            for side, root in sides.items():
                cmd = [sys.executable, str(HERE / "train_precision.py"), "--json", "--steps", str(args.steps),
                       "--seq-len", str(args.seq_len), "--lr", str(args.lr), "--data", args.data]
                out = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(root)), check=True,
                                     capture_output=True, text=True).stdout
                results[side] = json.loads(out.strip().splitlines()[-1])
        finally:
            if args.compare:
                subprocess.run(["git", "-C", str(HERE.parent), "worktree", "remove", "--force", str(base)], check=False)
    print(f"small preset, short conv 24, seq-len {args.seq_len}, batch 2, {args.steps} steps from one initialisation "
          f"on POP909 train windows; valid NLL (nats/token, fp32 evaluation, 16 fixed windows)")
    print(f"{'code':<14}{'fp32':>10}{'bf16':>10}{'bf16 - fp32':>13}")
    for side, r in results.items():
        print(f"{side:<14}{r['fp32']:>10.4f}{r['bf16']:>10.4f}{r['bf16'] - r['fp32']:>+13.4f}")


if __name__ == "__main__":
    main()
