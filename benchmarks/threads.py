"""CPU threads for generation, side by side: `spemusic generate --length L --num N` through the CLI
with --threads 1, with all cores, and with the default (no --threads), on an idle machine and
beside other work (one busy process per core doing fp32 matrix products, as a training run or a
second user would), so the default of `--threads` can be read off the table.

Each cell is the sampling rate the CLI reports (--json tokens_per_s, model loading and priming
excluded) and the command's wall time, the best of --repeats runs.

    python benchmarks/threads.py [--length 256] [--nums 1 2 4 8] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def busy(stop) -> None:
    """One core's worth of other work: 1-thread fp32 matmuls until told to stop."""
    import torch

    torch.set_num_threads(1)
    a = torch.randn(512, 512)
    while not stop.is_set():
        a = torch.tanh(a @ a)


def run(length: int, num: int, threads: int | None, out: Path) -> tuple[float, float]:
    """(tokens/s of sampling, wall seconds of the command)."""
    cmd = [sys.executable, "-m", "spemusic", "generate", "--length", str(length), "--num", str(num), "--seed", "1",
           "-o", str(out / f"piece-{time.monotonic_ns()}.mid"), "--json"]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    rate = json.loads(proc.stdout.splitlines()[0])["tokens_per_s"]
    return rate, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--nums", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    choices = [("1", 1), (f"{cores} (all)", cores), ("default", None)]
    print(f"spemusic generate --length {args.length}, pop-piano, {cores} cores; "
          f"sampling tokens/s, all pieces together (wall s of the command), best of {args.repeats}")
    with tempfile.TemporaryDirectory() as tmp:
        for load in ("idle", "busy"):
            stop = mp.Event()
            workers = [mp.Process(target=busy, args=(stop,)) for _ in range(cores if load == "busy" else 0)]
            for w in workers:
                w.start()
            try:
                print(f"\n{load}" + (f" ({cores} busy processes beside it)" if workers else ""))
                print(f"{'--num':>6}" + "".join(f"{'--threads ' + name:>24}" for name, _ in choices))
                for num in args.nums:
                    cells = []
                    for _, threads in choices:
                        best = max((run(args.length, num, threads, Path(tmp)) for _ in range(args.repeats)),
                                   key=lambda r: r[0])
                        cells.append(f"{best[0]:>10.1f} tok/s ({best[1]:>5.1f} s)")
                    print(f"{num:>6}" + "".join(f"{c:>24}" for c in cells), flush=True)
            finally:
                stop.set()
                for w in workers:
                    w.join()


if __name__ == "__main__":
    main()
