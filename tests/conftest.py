"""Shared fixtures: the real data sets and small hand-made MIDI files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
