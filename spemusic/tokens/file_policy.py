"""Which files are read, and how: every command reads MIDI through here. A missing, empty, non-MIDI,
corrupt or absurdly long file is a MidiError naming it (after the byte repair of
:mod:`spemusic.tokens.midi_repair`); the reader policy skips or clips what MIDI cannot mean,
and says so; the tracks' notes become one set of arrays (:class:`Parsed`), each with the
program code of its track (its part by name, drums, or its GM program)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np
import symusic

from spemusic.errors import MidiError
from spemusic.files import check_input_file
from spemusic.tokens.midi_repair import skip_short_meta, truncation
from spemusic.tokens.vocabulary import CHORD_MARKS, CHORD_SET, DRUMS, PART_CODES, part_of_track

if TYPE_CHECKING:
    from spemusic.tokens.vocabulary import Vocabulary


MAX_BARS = 100_000  # guard against files with absurd note times


def read_midi(path) -> tuple[symusic.Score, list[str]]:
    """A MIDI file as a symusic Score in ticks, read by the reader policy (see :func:`_policy`),
    and what the policy skipped or clipped, in plain sentences; a missing, empty, non-MIDI or
    corrupt file is a MidiError naming the file and the reason. Every command reads MIDI here."""
    name = str(path)
    check_input_file(path, error=MidiError)  # a named pipe would block the read forever
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as e:
        raise MidiError(f"{name}: cannot read ({_one_line(e.strerror or e)})") from None
    return parse_midi_bytes(data, name)


def read_score(path) -> symusic.Score:
    """read_midi without its warnings."""
    return read_midi(path)[0]


def _first(what: str, ticks, more: int) -> str:
    return f"{what} at tick {int(ticks)}" + (f" (and {more} more)" if more else "")


def _policy(score: symusic.Score) -> list[str]:
    """The reader policy, in place: what MIDI cannot mean is skipped or clipped, and said, so that
    every command reads a file the same way. A tempo of 0 microseconds per beat, a time signature
    with a numerator or denominator of 0 and a key signature beyond 7 sharps or flats are skipped;
    data bytes above 127 (symusic keeps them: a pitch of 200 reads -56) are clipped to 127 (a pitch
    bend to its range)."""
    notes = []
    bad = [t for t in score.tempos if t.mspq <= 0]
    if bad:
        notes.append(_first("a tempo of 0 microseconds per beat", bad[0].time, len(bad) - 1) + " is skipped")
        score.tempos = [t for t in score.tempos if t.mspq > 0]
    bad = [t for t in score.time_signatures if t.numerator == 0 or t.denominator == 0]
    if bad:
        notes.append(_first(f"time signature {bad[0].numerator}/{bad[0].denominator}", bad[0].time, len(bad) - 1)
                     + " is skipped")
        score.time_signatures = [t for t in score.time_signatures if t.numerator and t.denominator]
    bad = [k for k in score.key_signatures if not -7 <= k.key <= 7 or k.tonality not in (0, 1)]
    if bad:
        k = bad[0]
        what = f"a key signature of {abs(k.key)} {'sharps' if k.key >= 0 else 'flats'}" if not -7 <= k.key <= 7 else \
            f"a key signature in mode {k.tonality % 256} (0 is major, 1 minor)"
        notes.append(_first(what, k.time, len(bad) - 1) + " is skipped")
        score.key_signatures = [k for k in score.key_signatures if -7 <= k.key <= 7 and k.tonality in (0, 1)]
    clipped = []  # (tick, what was done) for every data byte above 127
    for tr in score.tracks:
        if tr.program > 127:
            clipped.append((0, f"program {tr.program} outside 0-127, clipped to 127"))
            tr.program = 127
        a = tr.notes.numpy()
        wrong = (a["pitch"] < 0) | (a["velocity"] < 0)  # int8: a byte of 128-255 reads negative
        if wrong.any():
            j = int(np.flatnonzero(wrong)[0])
            what = f"note {int(a['pitch'][j]) % 256} velocity {int(a['velocity'][j]) % 256} outside 0-127, clipped to 127"
            clipped += [(int(a["time"][j]), what)] * int(wrong.sum())
            pitch = np.where(a["pitch"] < 0, 127, a["pitch"]).astype(np.int8)
            vel = np.where(a["velocity"] < 0, 127, a["velocity"]).astype(np.int8)
            tr.notes = symusic.Note.from_numpy(a["time"], a["duration"], pitch, vel, ttype="tick")
        c = tr.controls.numpy()
        if ((c["number"] > 127) | (c["value"] > 127)).any():  # (one look in numpy; a loop only where needed)
            for c in tr.controls:
                if c.number > 127 or c.value > 127:
                    clipped.append((c.time, f"controller {c.number} value {c.value} outside 0-127, clipped to 127"))
                    c.number, c.value = min(c.number, 127), min(c.value, 127)
        b = tr.pitch_bends.numpy()["value"]
        if ((b < -8192) | (b > 8191)).any():
            for b in tr.pitch_bends:
                if not -8192 <= b.value <= 8191:
                    clipped.append((b.time, f"pitch bend {b.value} outside -8192-8191 (a data byte above 127), clipped"))
                    b.value = min(max(b.value, -8192), 8191)
    if clipped:
        tick, what = min(clipped)
        more = f" (and {len(clipped) - 1} more)" if len(clipped) > 1 else ""
        notes.append(f"{what}, at tick {tick}{more}")
    return notes


def _check_time(score: symusic.Score, name: str) -> None:
    """Refuse a score whose times mean nothing any command could write, draw or play."""
    if score.ticks_per_quarter <= 0:  # every tick's meaning divides by it
        raise MidiError(f"{name}: invalid ticks per beat ({score.ticks_per_quarter})")
    for tr in score.tracks:  # symusic keeps ticks in 32 bits: later ones read negative
        a = tr.notes.numpy()
        if (a["time"] < 0).any() or (a["time"] + a["duration"].astype(np.int64) < 0).any():
            raise MidiError(f"{name}: a note lies beyond tick 2^31 - 1, further than a MIDI time can reach")
    end = int(score.end())
    if end > MAX_BARS * score.ticks_per_quarter:
        raise MidiError(f"{name}: too long (an event at beat {end / score.ticks_per_quarter:.0f}; at most "
                        f"{MAX_BARS:,} beats)")


def _one_line(msg: str, limit: int = 160) -> str:
    msg = " ".join(str(msg).split())
    for junk in ("MiniMidi: ", ": iostream error"):
        msg = msg.replace(junk, "")
    msg = msg.strip(" !:")
    return msg[:limit] if len(msg) > limit else msg


class Parsed:
    """A MIDI file's notes as arrays (onset tick, duration, pitch, velocity, program code), with its
    ticks per beat, tempo and time-signature events, chord markers and the reader's warnings."""

    __slots__ = ("name", "tpq", "time", "dur", "pitch", "vel", "prog", "tempo_time", "tempo_qpm", "ts_time", "ts_num", "ts_den",
                 "chord_marks", "warnings")


def read_parsed(tok: Vocabulary, midi) -> Parsed:
    """A MIDI file (path, bytes, symusic.Score or miditoolkit.MidiFile) as the arrays encoding reads."""
    name, warnings = "<midi>", []
    if isinstance(midi, (str, os.PathLike)):
        name = str(midi)
        score, warnings = read_midi(midi)
    elif isinstance(midi, (bytes, bytearray, memoryview)):
        name = "<bytes>"
        score, warnings = parse_midi_bytes(bytes(midi), name)
    elif isinstance(midi, symusic.Score):
        name = "<symusic.Score>"
        score = midi if midi.ttype == "Tick" or str(midi.ttype).lower().endswith("tick") else midi.to("tick")
        _check_time(score, name)
    elif type(midi).__module__.startswith("miditoolkit"):
        p = from_miditoolkit(tok, midi)
        p.warnings = []
        return p
    else:
        raise TypeError(f"cannot encode a {type(midi).__name__}; pass a path, bytes, a miditoolkit.MidiFile "
                        "or a symusic.Score")
    p = from_score(tok, score, name)
    p.warnings = warnings
    return p


def parse_midi_bytes(data: bytes, name: str) -> tuple[symusic.Score, list[str]]:
    """The bytes of a MIDI file as a Score, repaired (midi_repair) and read by the reader policy, and
    the policy's sentences; a MidiError names `name` and what is wrong."""
    if len(data) == 0:
        raise MidiError(f"{name}: empty file")
    if not data.startswith(b"MThd"):
        if data.startswith(b"RIFF"):
            raise MidiError(f"{name}: RIFF MIDI files are not supported (bad header)")
        raise MidiError(f"{name}: not a MIDI file (bad header)")
    problem = truncation(data)
    if problem:
        raise MidiError(f"{name}: corrupt MIDI file ({problem})")
    data, notes = skip_short_meta(data)
    try:
        score = symusic.Score.from_midi(data)
    except Exception as e:  # noqa: BLE001 - symusic raises RuntimeError/ValueError with a C++ message
        raise MidiError(f"{name}: corrupt MIDI file ({_one_line(e)})") from None
    _check_time(score, name)
    return score, notes + _policy(score)


def program_code(tok: Vocabulary, track_name: str, is_drum: bool, program: int) -> int:
    """The program code of a track's notes: its part (by name, with parts), drums, or its GM program."""
    if is_drum:
        return DRUMS
    part = part_of_track(track_name) if tok.config.parts else None
    return PART_CODES[part] if part else int(program)


def from_score(tok: Vocabulary, score: symusic.Score, name: str) -> Parsed:
    p = Parsed()
    p.name = name
    p.tpq = int(score.ticks_per_quarter)  # (checked with the note times by _check_time)
    times, durs, pitches, vels, progs = [], [], [], [], []
    for tr in score.tracks:
        if len(tr.notes) == 0:
            continue
        a = tr.notes.numpy()
        times.append(a["time"])
        durs.append(a["duration"])
        pitches.append(a["pitch"])
        vels.append(a["velocity"])
        progs.append(np.full(len(a["time"]), program_code(tok, tr.name, tr.is_drum, tr.program), dtype=np.int64))
    if not times:
        raise MidiError(f"{name}: no notes")
    p.time = np.concatenate(times).astype(np.int64)
    p.dur = np.concatenate(durs).astype(np.int64)
    p.pitch = np.concatenate(pitches).astype(np.int64)
    p.vel = np.concatenate(vels).astype(np.int64)
    p.prog = np.concatenate(progs)
    t = score.tempos.numpy()
    p.tempo_time = t["time"].astype(np.int64)
    with np.errstate(divide="ignore"):
        p.tempo_qpm = 6e7 / t["mspq"].astype(np.float64)
    s = score.time_signatures.numpy()
    p.ts_time = s["time"].astype(np.int64)
    p.ts_num = s["numerator"].astype(np.int64)
    p.ts_den = s["denominator"].astype(np.int64)
    p.chord_marks = [(int(m.time), CHORD_MARKS[m.text]) for m in score.markers if m.text in CHORD_SET]
    return p


def from_miditoolkit(tok: Vocabulary, mf) -> Parsed:
    name = "<miditoolkit.MidiFile>"
    p = Parsed()
    p.name = name
    p.tpq = int(mf.ticks_per_beat)
    if p.tpq <= 0:
        raise MidiError(f"{name}: invalid ticks per beat ({p.tpq})")
    codes = [program_code(tok, inst.name, inst.is_drum, inst.program) for inst in mf.instruments]
    rows = [
        (n.start, n.end - n.start, n.pitch, n.velocity, code)
        for inst, code in zip(mf.instruments, codes)
        for n in inst.notes
    ]
    if not rows:
        raise MidiError(f"{name}: no notes")
    a = np.array(rows, dtype=np.int64)
    p.time, p.dur, p.pitch, p.vel, p.prog = (a[:, i] for i in range(5))
    if (p.time < 0).any():
        raise MidiError(f"{name}: negative note times")
    p.dur = np.maximum(p.dur, 0)
    tc = sorted(mf.tempo_changes, key=lambda x: x.time)
    p.tempo_time = np.array([x.time for x in tc], dtype=np.int64)
    p.tempo_qpm = np.array([x.tempo for x in tc], dtype=np.float64)
    tsc = sorted(mf.time_signature_changes, key=lambda x: x.time)
    p.ts_time = np.array([x.time for x in tsc], dtype=np.int64)
    p.ts_num = np.array([x.numerator for x in tsc], dtype=np.int64)
    p.ts_den = np.array([x.denominator for x in tsc], dtype=np.int64)
    p.chord_marks = [(int(m.time), CHORD_MARKS[m.text]) for m in getattr(mf, "markers", []) if m.text in CHORD_SET]
    return p
