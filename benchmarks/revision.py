"""Run a benchmark's measurement on the code of another git revision, for before/after figures
side by side in one run: a temporary worktree of REV, and the same script run as a subprocess with
that worktree (or this tree) first on PYTHONPATH, printing its result as one JSON line."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OLD = "ca89b1b"  # the code before the compiled step (issue 38): Performer.step, eager, at every token


@contextlib.contextmanager
def checkout(rev: str):
    """A temporary worktree of rev (removed afterwards, also on failure or Ctrl-C)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rev"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), rev],
                       check=True, capture_output=True)
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=False)


def run_json(script: Path, args: list[str], code_root: Path) -> dict:
    """`python script --json args…` with code_root's spemusic imported; its last line, parsed."""
    out = subprocess.run([sys.executable, str(script), "--json", *map(str, args)],
                         env=dict(os.environ, PYTHONPATH=str(code_root)), check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def spemusic_module(name: str):
    """spemusic's module `name` ("nn.model"), or, in a revision from before the package had folders
    (--compare), the flat module it was ("spemusic.model")."""
    try:
        return importlib.import_module(f"spemusic.{name}")
    except ModuleNotFoundError as e:
        if e.name not in (f"spemusic.{name}", f"spemusic.{name.partition('.')[0]}"):
            raise
        return importlib.import_module(f"spemusic.{name.rpartition('.')[2]}")
