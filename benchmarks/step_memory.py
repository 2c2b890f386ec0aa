"""Peak memory of one training step with FAVOR+'s compiled region (φ and the chunked attention
fused by inductor, as training runs them) against its eager path (the chunk products recomputed
in the backward pass under activation checkpointing), side by side: the process's peak RSS
during a step (Linux: VmHWM, reset after two warm-up steps), each mode in fresh processes,
alternating. The other compiled regions are compiled in both.

    python benchmarks/step_memory.py [--seq-len 2048] [--batch-size 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import torch
import torch.nn.functional as F


def child(mode: str, seq_len: int, batch: int) -> None:
    import spemusic.model as M
    from spemusic import ModelConfig, Performer

    torch.set_num_threads(2)
    torch.manual_seed(0)
    cfg = ModelConfig.preset("small", vocab_size=589, short_conv=24, max_len=seq_len)
    model = Performer(cfg).train()
    ids = torch.randint(3, 589, (batch, seq_len + 1))
    M.compiled_unavailable = (lambda: None) if mode == "compiled" else (lambda: "eager, as asked")

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
        model.zero_grad(set_to_none=True)

    def status_mib(key: str) -> float:
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key)) / 1024

    step(), step()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the present RSS
    start = status_mib("VmRSS:")
    step()
    print(f"{start:.0f} {status_mib('VmHWM:'):.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.seq_len, args.batch_size)
        return
    print(f"small preset, short conv 24, seq-len {args.seq_len}, batch {args.batch_size}, bf16 autocast, 2 threads; "
          f"peak RSS during one training step, MiB (RSS at its start)")
    for r in range(args.rounds):
        row = []
        for mode in ("compiled", "eager"):
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--seq-len", str(args.seq_len),
                                  "--batch-size", str(args.batch_size)], capture_output=True, text=True, check=True)
            start, peak = out.stdout.split()[-2:]
            row.append(f"{mode} {peak:>6} ({start})")
        print(f"round {r + 1}:  " + "   ".join(row))


if __name__ == "__main__":
    main()
