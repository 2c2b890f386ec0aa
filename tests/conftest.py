"""Shared fixtures: the real data sets and small hand-made MIDI files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The tests run the training step's compiled regions uncompiled (compiling every test's shapes
# would cost minutes); the tests that take the `compiling` fixture check the compiled ones.
os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO / ".." / "shared" / "data"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data relative to the repo; fails in CI (CI=1/true) and skips elsewhere when missing."""
    if not SHARED_DATA.is_dir():
        msg = f"../shared/data not found: {SHARED_DATA.resolve()} (POP909 and Groove MIDI files for the real-data tests)"
        if in_ci():
            pytest.fail(msg)
        pytest.skip(msg)
    return SHARED_DATA


def make_midi(
    path,
    notes=(),
    *,
    ticks_per_beat: int = 480,
    tempos=((120.0, 0),),
    time_signatures=((4, 4, 0),),
) -> Path:
    """Write a small MIDI file with miditoolkit.

    notes: (program, is_drum, pitch, start_tick, end_tick, velocity) tuples; one
    instrument per (program, is_drum).  tempos: (bpm, tick); time_signatures:
    (numerator, denominator, tick).
    """
    from miditoolkit import Instrument, MidiFile, Note, TempoChange, TimeSignature

    mf = MidiFile(ticks_per_beat=ticks_per_beat)
    insts: dict[tuple[int, bool], Instrument] = {}
    for program, is_drum, pitch, start, end, velocity in notes:
        key = (int(program), bool(is_drum))
        if key not in insts:
            insts[key] = Instrument(program=key[0], is_drum=key[1], name=f"p{key[0]}{'d' if key[1] else ''}")
        insts[key].notes.append(Note(velocity=int(velocity), pitch=int(pitch), start=int(start), end=int(end)))
    mf.instruments = list(insts.values())
    mf.tempo_changes = [TempoChange(float(bpm), int(t)) for bpm, t in tempos]
    mf.time_signature_changes = [TimeSignature(int(n), int(d), int(t)) for n, d, t in time_signatures]
    mf.max_tick = max([int(n[4]) for n in notes] + [0])
    path = Path(path)
    mf.dump(str(path))
    return path


@pytest.fixture
def midi_factory(tmp_path):
    """Return make_midi bound to tmp_path: midi_factory("name.mid", notes, **kw) -> Path."""
    counter = iter(range(10**6))

    def _make(name: str | None = None, notes=(), **kw) -> Path:
        return make_midi(tmp_path / (name or f"hand{next(counter)}.mid"), notes, **kw)

    return _make


# ----------------------------------------------------------------------------- CLI and models

@pytest.fixture(autouse=True)
def _keep_sigint_handler():
    """spemusic's main ignores Ctrl-C once it exits: tests that run it in this process leave the
    handler as they found it."""
    import signal

    handler = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, handler)


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """Run `spemusic ARGS...` in this process: returns (exit code, stdout, stderr)."""
    import sys

    from spemusic.cli import main

    def _run(*args) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["spemusic", *map(str, args)])
        capsys.readouterr()
        code = 0
        try:
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A randomly initialised tiny model saved as a spemusic checkpoint (enough for grammar,
    determinism and I/O tests; the shipped models are tested separately)."""
    import torch

    from spemusic import ModelConfig, Performer, REMITokenizer
    from spemusic.nn.checkpoint import WEIGHTS, write_weights

    torch.manual_seed(0)
    tok = REMITokenizer()
    model = Performer(ModelConfig.preset("tiny", vocab_size=len(tok), pe="sinespe", gated=True))
    folder = tmp_path_factory.mktemp("tiny-model")
    write_weights(folder / WEIGHTS, model, tok.config,
                  {"seq_len": 256, "data": "random init", "parameters": model.num_parameters()})
    return folder


@pytest.fixture(scope="session")
def examples(tmp_path_factory) -> dict[str, Path]:
    """The example prompts (a drum groove and a piano phrase), written by the tests themselves."""
    from spemusic.tokens.examples import drum_groove, piano_phrase

    folder = tmp_path_factory.mktemp("examples")
    paths = {"groove": folder / "groove.mid", "piano": folder / "piano.mid"}
    drum_groove().dump(str(paths["groove"]))
    piano_phrase().dump(str(paths["piano"]))
    return paths


@pytest.fixture
def compiling(monkeypatch):
    """torch.compile on for this test (conftest turns it off for the others)."""
    import torch._dynamo

    from spemusic.nn import compiled

    monkeypatch.setattr(compiled, "_REGIONS", {})
    monkeypatch.setattr(compiled, "_failure", None)
    # torch's own patch, not monkeypatch: pytest >= 9.2 undoes a setattr on a module by deleting
    # the name from its __dict__, which hides a torch config entry for the rest of the session
    with torch._dynamo.config.patch(disable=False):
        yield
    torch._dynamo.reset()


def pytest_configure(config):
    config.addinivalue_line("markers", "jax: uses JAX (runs after every other test: JAX's threads and fork)")


def pytest_collection_modifyitems(config, items):
    """JAX tests last: JAX starts threads, and a test that forks after them (data prepare's
    workers) would copy a process whose locks those threads may hold."""
    items.sort(key=lambda item: item.get_closest_marker("jax") is not None)  # stable: the rest keep their order
