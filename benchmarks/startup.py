"""Start-up time of `spemusic --help` (the command line imports no torch until a command needs it).

    python benchmarks/startup.py [--compare REV]

--compare REV: the same for the code of git revision REV (a temporary worktree), side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from revision import REPO, checkout  # (benchmarks/, the script's own folder)


def help_seconds(code_root: Path, runs: int = 7) -> float:
    """Median wall time of `python -m spemusic --help` with code_root's spemusic."""
    env = dict(os.environ, PYTHONPATH=str(code_root))
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "spemusic", "--help"], env=env, capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compare", metavar="REV")
    args = ap.parse_args()
    if not args.compare:
        print(f"spemusic --help: {help_seconds(REPO):.3f} s (median of 7)")
        return
    with checkout(args.compare) as base:
        for _ in range(2):  # alternating, so that a busy moment slows both
            print(f"spemusic --help, median of 7: {args.compare} {help_seconds(base):.3f} s, "
                  f"this tree {help_seconds(REPO):.3f} s")


if __name__ == "__main__":
    main()
