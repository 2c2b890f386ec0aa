"""Every `spemusic` command of the README that needs only the repository's files runs as written,
in the README's order, from a fresh folder (sizes made small: --bars 2, --length 384, --num 2)."""

from __future__ import annotations

import re
import shlex
import shutil

import pytest
from conftest import REPO

# commands that need what a fresh clone lacks: data sets, a trained run, a sound card, Docker
NEEDS_MORE = ("../shared", "my_midis", "my_drums", "runs/", "cache/", "/data")
SKIPPED_COMMANDS = {"train", "play", "eval", "data"}
SMALL = {"--bars": "2", "--length": "384", "--num": "2"}


def readme_commands() -> list[list[str]]:
    """The `spemusic …` lines of the README's bash blocks, as argument lists, in order."""
    text = (REPO / "README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                if part.strip().startswith("spemusic "):
                    out.append(shlex.split(part, comments=True)[1:])
    return out


def small(args: list[str]) -> list[str]:
    """The same command with small sizes (an integer --bars only: --bars 1:8 of `show` is a range)."""
    out = list(args)
    for i, a in enumerate(out[:-1]):
        if a in SMALL and out[i + 1].isdigit():
            out[i + 1] = SMALL[a]
    return out


def runnable(args: list[str]) -> bool:
    line = " ".join(args)
    return args[0] not in SKIPPED_COMMANDS and not any(s in line for s in NEEDS_MORE)


def test_the_readme_has_commands_to_run():
    commands = [c for c in readme_commands() if runnable(c)]
    names = {c[0] for c in commands}
    assert {"generate", "continue", "accompany", "show", "render", "tokenize", "detokenize"} <= names, names
    assert len(commands) >= 15


def test_readme_commands_run_as_written(run_cli, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")  # --png and `show` draw with the [plot] extra, as the Quickstart installs
    shutil.copytree(REPO / "data", tmp_path / "data")  # the clone's files, in a folder of their own
    monkeypatch.chdir(tmp_path)
    for args in readme_commands():
        if not runnable(args):
            continue
        code, _, err = run_cli(*small(args))
        assert code == 0, f"spemusic {' '.join(args)}: {err}"
