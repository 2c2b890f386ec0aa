"""Peak memory of one training step with FAVOR+'s training attention compiled (φ and the chunked
attention fused by inductor, each way, as training runs them) against the same uncompiled (eager,
as on a machine without a C++ compiler), side by side: the process's peak RSS during a step
(Linux: VmHWM, reset after two warm-up steps), each mode in fresh processes, alternating. The
other compiled regions are compiled in both.

--saved: where a compiled step's memory goes instead: the tensors autograd keeps for the backward
pass (each storage once, grouped by the spemusic function that saved it), and the process's RSS
after importing torch, after building the model, after a first tiny step (the compiler's own
memory) and at the peak of the measured step; fp32 or bf16.

    python benchmarks/step_memory.py [--seq-len 2048] [--batch-size 2] [--rounds 2]
    python benchmarks/step_memory.py --saved [--precision fp32] [--batch-size 4]
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys

import torch
import torch.nn.functional as F


def train_step(model, ids: torch.Tensor, precision: str, pack=None) -> None:
    """Forward, loss and backward (no optimizer: memory is the point); `pack` sees each tensor
    autograd keeps for the backward pass."""
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t) if pack else contextlib.nullcontext()
    with hooks:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()
    model.zero_grad(set_to_none=True)


def child(mode: str, seq_len: int, batch: int) -> None:
    import spemusic.nn.attention
    from spemusic import ModelConfig, Performer

    torch.set_num_threads(2)
    torch.manual_seed(0)
    cfg = ModelConfig.preset("small", vocab_size=589, short_conv=24, max_len=seq_len)
    model = Performer(cfg).train()
    ids = torch.randint(3, 589, (batch, seq_len + 1))
    if mode == "eager":
        spemusic.nn.attention.compiled = lambda fn: fn  # FAVOR+'s two regions run as plain functions

    def step():
        train_step(model, ids, "bf16")

    def status_mib(key: str) -> float:
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key)) / 1024

    step(), step()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the present RSS
    start = status_mib("VmRSS:")
    step()
    print(f"{start:.0f} {status_mib('VmHWM:'):.0f}")


def saved(seq_len: int, batch: int, precision: str) -> None:
    import collections
    import resource
    import traceback

    from spemusic import ModelConfig, Performer

    def rss_mib() -> float:
        return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize() / 2**20

    torch.set_num_threads(2)
    torch.manual_seed(0)
    rows = [("torch imported", rss_mib())]
    cfg = ModelConfig.preset("small", vocab_size=589, short_conv=24, max_len=seq_len)
    model = Performer(cfg).train()
    rows.append(("model built", rss_mib()))

    train_step(model, torch.randint(3, 589, (1, 257)), precision)
    rows.append(("after a first tiny step (compiled)", rss_mib()))
    ids = torch.randint(3, 589, (batch, seq_len + 1))
    train_step(model, ids, precision), train_step(model, ids, precision)
    kept = {}

    def keep(t):
        where = [f for f in traceback.extract_stack()[:-1] if "spemusic" in f.filename]
        kept.setdefault(t.untyped_storage().data_ptr(), (t.untyped_storage().nbytes(), where[-1].name if where else "?"))
        return t

    train_step(model, ids, precision, keep)
    rows.append(("peak (RSS high-water mark), after 4 steps", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
    by_fn = collections.defaultdict(lambda: [0, 0])
    for nbytes, fn in kept.values():
        by_fn[fn][0] += nbytes
        by_fn[fn][1] += 1
    print(f"small preset, short conv 24, seq-len {seq_len}, batch {batch}, {precision}, 2 threads")
    print("\ntensors kept for the backward pass, by the function that saved them (MiB, storages)")
    for fn, (nbytes, n) in sorted(by_fn.items(), key=lambda kv: -kv[1][0]):
        print(f"  {fn:<24} {nbytes / 2**20:8.1f} {n:5d}")
    print(f"  {'all':<24} {sum(b for b, _ in kept.values()) / 2**20:8.1f} {len(kept):5d}")
    print("\nprocess RSS, MiB")
    for what, mib in rows:
        print(f"  {what:<44} {mib:7.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--saved", action="store_true", help="where one step's memory goes (see above)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="with --saved")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.saved:
        saved(args.seq_len, args.batch_size, args.precision)
        return
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
