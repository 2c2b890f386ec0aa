"""Does a faster training step still learn the same? Short fine-tuning runs of a trained model
on real POP909 windows, fp32 and bf16 autocast, for this tree and (with --compare REV) for git
revision REV, side by side: the validation NLL (nats per token) on fixed valid windows after the
same steps. Each configuration runs with two seeds (batches and SPE draws); their spread is the
noise a change of arithmetic is to be compared with. A trained starting point keeps the runs
close together (from scratch, early training is chaotic: 0.1 nats apart after 60 steps).

    python benchmarks/train_precision.py [--steps 40] [--compare REV] [--model pop-piano]

Defaults: the shipped pop-piano, seq-len 1,024, batch 2, lr 2e-4 after 5 warmup steps; POP909
re-barred by its beats, with chords (the tokenizer cache that `spemusic train` makes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import numpy as np
import torch

from _errors import run_script  # (benchmarks/, the script's own folder)
from revision import REPO, checkout, run_json, spemusic_module  # (benchmarks/, the script's own folder)

DATA = REPO / ".." / "shared" / "data" / "pop909"


def run(args) -> dict:
    load_model = spemusic_module("nn.checkpoint").load_model
    data_module, train_module = spemusic_module("training.data"), spemusic_module("training.train")
    WindowSampler, fixed_windows, open_dataset = data_module.WindowSampler, data_module.fixed_windows, data_module.open_dataset
    evaluate_windows, lm_loss = train_module.evaluate_windows, train_module.lm_loss

    try:
        build_optimizer = train_module.build_optimizer
    except AttributeError:  # a revision from before build_optimizer: its trainer's AdamW
        def build_optimizer(model, lr, wd, device):
            return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=wd)

    data = Path(args.data)
    cache = open_dataset(data, beats_dir=data / "beats", chords_dir=data / "chords")
    pad = cache.tokenizer.pad_id
    valid = fixed_windows(cache, "valid", args.seq_len, max_windows=16)
    result = {}
    for seed in (0, 1):
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            model, _ = load_model(args.model)
            model.float().train()
            opt = build_optimizer(model, args.lr, 0.1, torch.device("cpu"))
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
            sampler, rng = WindowSampler(cache, "train", args.seq_len), np.random.default_rng(seed)
            torch.manual_seed(seed)
            for _ in range(args.steps):
                batch = torch.from_numpy(sampler.sample(rng, 2).astype(np.int64))
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                    loss, _ = lm_loss(model, batch, pad)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
            result[f"{name} seed {seed}"] = evaluate_windows(model, valid, pad, torch.device("cpu"), torch.float32)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--model", default="pop-piano")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--compare", metavar="REV")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.json:
        print(json.dumps(run(args)))
        return
    resolve = spemusic_module("nn.checkpoint").resolve

    # the weights file itself, so that both sides fine-tune the same model (a name would give each
    # revision its own shipped one)
    weights = resolve(args.model).resolve()
    worker = ["--steps", args.steps, "--seq-len", args.seq_len, "--lr", args.lr, "--data", args.data,
              "--model", weights]
    script = Path(__file__)
    with contextlib.ExitStack() as stack:
        sides = {args.compare: stack.enter_context(checkout(args.compare))} if args.compare else {}
        sides["this tree"] = REPO
        results = {side: run_json(script, worker, root) for side, root in sides.items()}
    print(f"{args.model} fine-tuned {args.steps} steps (seq-len {args.seq_len}, batch 2, lr {args.lr:g}) on POP909 "
          f"train windows; valid NLL (nats/token, fp32 evaluation, 16 fixed windows), two seeds each")
    print(f"{'code':<14}{'fp32 seed 0':>12}{'seed 1':>9}{'bf16 seed 0':>13}{'seed 1':>9}{'bf16 - fp32':>13}{'seed spread':>13}")
    for side, r in results.items():
        f0, f1, b0, b1 = (r[f"{p} seed {s}"] for p in ("fp32", "bf16") for s in (0, 1))
        diff = (b0 + b1 - f0 - f1) / 2
        spread = max(abs(f0 - f1), abs(b0 - b1))
        print(f"{side:<14}{f0:>12.4f}{f1:>9.4f}{b0:>13.4f}{b1:>9.4f}{diff:>+13.4f}{spread:>13.4f}")

if __name__ == "__main__":
    run_script(main)
