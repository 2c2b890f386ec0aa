"""REMI tokenizer for multi-track MIDI: the token language of spemusic.

Reading and writing go through symusic (C++); the encoding itself is
vectorised numpy (benchmarks/tokenize_speed.py times it).
miditoolkit objects are accepted and produced at the edges.

Vocabulary (ids in this order; the order is part of the format)
----------------------------------------------------------------
``PAD``, ``BOS``, ``EOS``, ``Bar``,
``TimeSig_{n}/{d}`` (``config.time_signatures``),
``Position_{0..P-1}`` with ``P = max_bar_beats * beat_resolution``,
``Tempo_{i}`` (bin index; ``tokenizer.tempo_values[i]`` is its BPM),
``Program_{0..127}``, ``Program_drums``, with parts (``config.parts``) also
``Program_melody``, ``Program_bridge``, ``Program_piano``,
``Pitch_{0..127}``,
``Velocity_{i}`` (bin index; ``tokenizer.velocity_values[i]`` is its MIDI velocity),
``Duration_{i}`` (bin index; ``tokenizer.duration_steps[i]`` is its length in grid steps).

Bins
----
* Position grid: ``beat_resolution`` steps per quarter note (default 12,
  so 16ths = 3 steps and 8th-triplets = 4 steps are exact).
* Velocity: ``num_velocity_bins`` equal-width bins over 1..127; a bin
  decodes to the middle velocity of its range.
* Tempo: ``num_tempo_bins`` geometric bins from ``tempo_min`` to
  ``tempo_max`` BPM (bin centres ``tempo_min * r**i``); a tempo is put in the
  nearest bin in log space, tempos outside the range in the end bins.
* Duration, in grid steps (``R = beat_resolution``): every step from 1 to R
  (one beat); then multiples of R/4 and R/3 up to 2 beats (16ths and
  triplets); then multiples of R/2 up to 4 beats; then whole beats up to
  ``max_duration_beats``.  With the defaults: 1..12, 15, 16, 18, 20, 21, 24,
  30, 36, 42, 48, 60, 72, 84, 96 (26 bins).  A note's duration is rounded to
  grid steps (at least 1) and then to the nearest bin (ties to the shorter);
  longer than the longest bin is clipped to it and counted.

Sequence grammar (all the tokenizer ever emits; the sampler masks to it)
-----------------------------------------------------------------------
``BOS``, then per bar: ``Bar``, ``TimeSig_x`` on the first bar and wherever
the time signature changes, then per onset in time order ``Position_p``
(strictly increasing inside the bar, ``p`` < bar length in steps), an
optional ``Tempo_t`` (always on the first onset of the piece, afterwards only
where the tempo bin in force changes), then per note at that onset, sorted
by (program, pitch) (non-decreasing; equal pairs are doublings) with drums
after the 128 GM programs:
``Program_x Pitch_y Velocity_v`` plus ``Duration_d`` for non-drum notes.
Empty bars are a lone ``Bar`` (+ ``TimeSig``).  Finally ``EOS``.

With ``melody_first`` (parts only) each bar is written in two sweeps: ``Bar``, ``TimeSig`` as
above, ``Tempo_t`` at the bar line (on the first bar, and wherever the bin in force at the bar
line changes; never at an onset), then the melody's onsets in time order (``Position`` and its
melody notes), then the other parts' onsets in time order, Position starting again from the
bar's beginning, with the ``Chord`` tokens. So every note of the accompaniment, and every chord
change, comes after the whole bar's melody: the accompaniment and its harmony see it, and the
melody's notes follow each other in the stream with nothing between them. The other parts'
sweep begins at a Position at or before the melody's last one, or at any Position whose first
token is a Chord or a note of another part. With ``chord_every_bar`` (and chord annotations) that
sweep opens on ``Position_0 Chord_x``, the chord in force at the bar line even when it does not
change there (from the piece's first chord on: a prompt without chords stays as it was): the model
names each bar's harmony right after hearing its melody.

Timing rules
------------
* Onsets are rounded to the nearest grid step (half up); a note landing on
  the next bar line belongs to that bar.  Tempo and time-signature events are
  rounded to the grid the same way.
* Bars follow the time-signature map (no TS -> 4/4; several at one time -> the
  last).  A time signature that is not in the config maps to an allowed one
  of the same bar length if there is one (closest denominator), else to the
  one with the nearest bar length.  A change that falls inside a bar cuts that
  bar short: the short bar gets the allowed time signature of exactly its
  length; if none exists, the change moves to the nearest bar line.
* The tempo token of an onset is the bin of the tempo in force at that onset
  (a tempo change counts from the grid step it rounds to; before the first
  tempo event MIDI's 120 BPM holds).
* Parts (``config.parts``): a track named MELODY, BRIDGE or PIANO (any case; POP909's
  three tracks, all program 0) is that part, whatever its program: its notes carry
  ``Program_melody``, ``Program_bridge`` or ``Program_piano`` instead of their GM program.
  Parts are roles, not instruments, so the tokens sit in the Program slot of a note and the
  grammar stays the same. Their codes follow the GM programs and drums (129, 130, 131), so
  inside an onset the melody's notes come first, then the bridge's, then the piano's: the
  notes of the accompaniment at an onset can see the melody sounding there, but not the
  melody of the rest of the bar; ``melody_first`` (above; as MMM's per-bar blocks, melody
  first) lets them see all of it. ``spemusic accompany`` holds the melody fixed by forcing its
  tokens (at its onsets in time order; after each Bar with melody_first). Tracks with other
  names are one part per program, as without parts.
* All other tracks are merged; drums are symusic's ``track.is_drum`` (channel 10).
  Notes that share (onset step, program, pitch) -- unison doublings across
  tracks (POP909 doubles its melody in the piano track; how often:
  benchmarks/tokenizer_fidelity.py) and flams that quantise to one step --
  are all kept, longest and loudest first, so no note is ever dropped; they
  are counted (``duplicate_notes``).
  Inside an onset the notes are therefore sorted by (program, pitch)
  non-decreasing, not strictly.

Decoding writes ``ticks_per_beat = beat_resolution * 40`` files, one track
per program (drums: ``is_drum``, program 0), drum notes one grid step long; one track per
part, named MELODY, BRIDGE or PIANO, playing ``part_programs`` (piano unless set).
A note that overlaps an earlier note of the same program and pitch (MIDI
cannot hold both on one channel) ends it, as MIDI players do (``overlaps="trim"``,
the default; of notes sharing an onset the longest is kept); with
``overlaps="layers"`` it goes to an extra "layer" track of the same program
instead, so durations survive exactly and re-encoding merges the layers again.
Chord tokens are written as MIDI markers (``A:min``; ``N.C.`` for none), which
encoding with a chord vocabulary reads back.

Beat annotations (``encode(midi, beats=...)``, see :mod:`spemusic.tokens.beats`)
replace the file's meter and grid: bars start at the annotated downbeats (a
bar of n beats is ``TimeSig_n/4``), onsets are placed between the annotated
beats, and each beat's tempo is its length in seconds. Chord annotations
(``chords=...``, see :mod:`spemusic.tokens.chords`) add ``Chord`` tokens after the
``Position`` of each change (a Position may then hold only its Chord).
It ignores tokens that do not fit the grammar instead of failing.
The round trip is idempotent: ``encode(decode(encode(f))) == encode(f)``.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from fractions import Fraction
from typing import Any

import numpy as np
import symusic

from spemusic.errors import ConfigError, MidiError
from spemusic.files import check_input_file, write_atomically
from spemusic.tokens.beats import BeatMap, Beats, TempoMap, read_beats
from spemusic.tokens.chords import CHORD_NAMES, read_chords

__all__ = ["TokenizerConfig", "REMITokenizer", "TokenError", "default_time_signatures"]

# Bump when the meaning of a token sequence changes: it is part of the fingerprint.
SCHEME = "remi-1"
TICKS_PER_STEP_OUT = 40
MAX_BARS = 100_000  # guard against files with absurd note times
# chord markers: vocabulary names, and "N.C." (no chord) for N, a word too common to read back
NO_CHORD_MARK = "N.C."
CHORD_MARKS = {**{n: n for n in CHORD_NAMES[:-1]}, NO_CHORD_MARK: CHORD_NAMES[-1]}
CHORD_SET = frozenset(CHORD_MARKS)

# Token kinds: REMITokenizer.kinds[id] is the kind of each id; the decoder and the grammar
# (spemusic.tokens.grammar) read them from there, so the vocabulary is defined once, in __init__
PAD, BOS, EOS, BAR, TIMESIG, POSITION, TEMPO, PROGRAM, PITCH, VELOCITY, DURATION, CHORD = range(12)
# the kinds that span a range of ids (REMITokenizer.range), in vocabulary order
KINDS = {"TimeSig": TIMESIG, "Position": POSITION, "Tempo": TEMPO, "Program": PROGRAM, "Pitch": PITCH,
         "Velocity": VELOCITY, "Duration": DURATION, "Chord": CHORD}
DRUMS = 128  # program code of drum notes
# parts (TokenizerConfig.parts): the roles of POP909's tracks, told apart by track name, with
# program codes after the drums (so a part's notes sort after every GM program at an onset)
PARTS = ("melody", "bridge", "piano")
PART_CODES = {name: DRUMS + 1 + i for i, name in enumerate(PARTS)}
PART_OF_CODE = {code: name for name, code in PART_CODES.items()}


def part_of_track(name: str) -> str | None:
    """The part a track plays, by its name (MELODY, BRIDGE, PIANO in any case; "PIANO (layer 2)",
    as decode names a part's overlapping notes, too), or None."""
    key = (name or "").split(" (layer ")[0].strip().lower()
    return key if key in PART_CODES else None


def parse_part_programs(text: str) -> dict[int, int]:
    """'melody=73,bridge=48' -> {part code: GM program}; a ConfigError names a bad item."""
    out = {}
    for item in (x.strip() for x in str(text).split(",") if x.strip()):
        part, _, program = item.partition("=")
        if not program.strip().isdigit() or not 0 <= int(program) <= 127:
            raise ConfigError(f"part program {item!r}: write PART=PROGRAM with a GM program 0-127 (melody=73)")
        out[PART_CODES[parse_parts(part)[0]]] = int(program)
    return out


def parse_parts(text: str) -> tuple[str, ...]:
    """'melody,piano' -> ('melody', 'piano'); a part that is not one of PARTS is a ConfigError."""
    names = tuple(dict.fromkeys(x.strip().lower() for x in str(text).split(",") if x.strip()))
    bad = [n for n in names if n not in PART_CODES]
    if bad or not names:
        what = f"unknown part {bad[0]!r}" if bad else "no part named"
        raise ConfigError(f"{what}: the parts are {', '.join(PARTS)} (comma-separated)")
    return names


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
    return REMITokenizer._parse_bytes(data, name)


def read_score(path) -> symusic.Score:
    """read_midi without its warnings."""
    return read_midi(path)[0]


class TokenError(MidiError, ValueError):
    """A token string or id that is not in the vocabulary."""


# (lowest, highest) of the integer fields: 960 steps a beat is the finest MIDI grid in common use;
# the rest are far above what music needs and bound the vocabulary a config can ask for
_TOKENIZER_INT_RANGES = dict(beat_resolution=(1, 960), num_velocity_bins=(1, 127), num_tempo_bins=(1, 1024),
                             max_duration_beats=(1, 64), max_bar_beats=(1, 64))
# the true/false fields, off by default (a config without one keeps the fingerprint it had before it existed)
_FLAGS = ("chords", "parts", "melody_first", "chord_every_bar", "drum_grid")


def default_time_signatures(max_bar_beats: int = 8, beat_resolution: int = 12) -> tuple[tuple[int, int], ...]:
    """n/2 (n >= 2), n/4, n/8 and n/16 (odd n >= 5 only) with bar length <= max_bar_beats quarters."""
    out: list[tuple[int, int]] = []
    cands = [(n, 2) for n in range(2, 9)] + [(n, 4) for n in range(1, 17)] + [(n, 8) for n in range(1, 33)]
    cands += [(n, 16) for n in (5, 7, 9, 11, 13, 15)]
    for n, d in cands:
        length = Fraction(4 * n, d)
        if length <= max_bar_beats and (length * beat_resolution).denominator == 1:
            out.append((n, d))
    return tuple(out)


@dataclass(frozen=True)
class TokenizerConfig:
    """Everything that defines the vocabulary and the quantisation.

    ``time_signatures=()`` means the default set for ``max_bar_beats``
    (see :func:`default_time_signatures`); it is filled in at construction.
    """

    beat_resolution: int = 12
    num_velocity_bins: int = 32
    num_tempo_bins: int = 32
    tempo_min: float = 30.0
    tempo_max: float = 300.0
    max_duration_beats: int = 8
    max_bar_beats: int = 8
    time_signatures: tuple[tuple[int, int], ...] = ()
    chords: bool = False  # Chord_<root>:<quality> tokens (appended to the vocabulary)
    parts: bool = False  # Program_melody / _bridge / _piano for tracks named so (after Program_drums)
    melody_first: bool = False  # with parts: each bar's melody, then the other parts; the tempo per bar
    chord_every_bar: bool = False  # with chords and melody_first: each bar's other parts open on the chord in force
    drum_grid: bool = False  # drum hits on their nearest sixteenth or eighth-note triplet (no microtiming)

    def __post_init__(self) -> None:
        # types and ranges first: the metadata of a checkpoint from elsewhere lands here, and a
        # string or a 10^9 must be named, not crash or allocate the vocabulary it implies
        for name, (lo, hi) in _TOKENIZER_INT_RANGES.items():
            val = getattr(self, name)
            if not isinstance(val, int) or isinstance(val, bool) or not lo <= val <= hi:
                raise ConfigError(f"tokenizer config: {name} must be an integer in {lo} … {hi:,}, not {val!r}")
        for name in ("tempo_min", "tempo_max"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not 1.0 <= val <= 10_000.0:
                raise ConfigError(f"tokenizer config: {name} must be a number of BPM in 1 … 10,000, not {val!r}")
        for name in _FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"tokenizer config: {name} must be true or false, not {getattr(self, name)!r}")
        if self.melody_first and not self.parts:
            raise ConfigError("tokenizer config: melody_first needs parts")
        if self.chord_every_bar and not (self.chords and self.melody_first):
            raise ConfigError("tokenizer config: chord_every_bar needs chords and melody_first")
        if self.drum_grid and self.beat_resolution % 12:
            raise ConfigError("tokenizer config: drum_grid needs a beat_resolution that is a multiple of 12")
        if not self.tempo_min <= self.tempo_max:
            raise ConfigError("tokenizer config: tempo_min must not be above tempo_max")
        if self.num_tempo_bins > 1 and not self.tempo_min < self.tempo_max:
            raise ConfigError("tokenizer config: several tempo bins need tempo_min < tempo_max")
        ts = self.time_signatures
        if not ts:
            ts = default_time_signatures(self.max_bar_beats, self.beat_resolution)
        if not isinstance(ts, (tuple, list)) or len(ts) > 4096 or not all(
                isinstance(t, (tuple, list)) and len(t) == 2 and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                                                                     for x in t) for t in ts):
            raise ConfigError("tokenizer config: time_signatures must be a list of at most 4,096 "
                              "[numerator, denominator] integer pairs")
        ts = tuple((int(n), int(d)) for n, d in ts)
        for n, d in ts:
            if n < 1 or d < 1:
                raise ConfigError(f"tokenizer config: bad time signature {n}/{d}")
            length = Fraction(4 * n, d)
            if length > self.max_bar_beats:
                raise ConfigError(f"tokenizer config: time signature {n}/{d} is longer than max_bar_beats={self.max_bar_beats}")
            if (length * self.beat_resolution).denominator != 1:
                raise ConfigError(f"tokenizer config: time signature {n}/{d} is not a whole number of grid steps")
        if len(set(ts)) != len(ts):
            raise ConfigError("tokenizer config: duplicate time signatures")
        object.__setattr__(self, "time_signatures", ts)
        object.__setattr__(self, "tempo_min", float(self.tempo_min))
        object.__setattr__(self, "tempo_max", float(self.tempo_max))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["time_signatures"] = [list(t) for t in self.time_signatures]
        for name in _FLAGS:  # configs without them keep the fingerprint they had before they existed
            if not d[name]:
                del d[name]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TokenizerConfig:
        if not isinstance(d, dict):
            raise ConfigError("tokenizer config must be a mapping")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown tokenizer config key(s): {', '.join(sorted(unknown))}")
        d = dict(d)
        if isinstance(d.get("time_signatures"), list):
            d["time_signatures"] = tuple(tuple(t) if isinstance(t, list) else t for t in d["time_signatures"])
        return cls(**d)

    def fingerprint(self) -> str:
        """Short stable hash: sha1 of the sorted JSON of the config (plus the scheme version)."""
        blob = json.dumps({"scheme": SCHEME, **self.to_dict()}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha1(blob.encode()).hexdigest()[:12]


def _duration_bins(res: int, max_beats: int) -> np.ndarray:
    top = res * max_beats
    s: set[int] = set(range(1, res + 1))
    for q in {max(1, res // 4), max(1, res // 3)}:
        s.update(range(res, 2 * res + 1, q))
    s.update(range(2 * res, 4 * res + 1, max(1, res // 2)))
    s.update(range(4 * res, top + 1, res))
    s.add(top)
    return np.array(sorted(x for x in s if x <= top), dtype=np.int64)


MAX_MIDI_TICK = 2**28 - 1  # the largest MIDI variable-length quantity
MAX_MIDI_TRACKS = 2**16 - 1  # a MIDI header counts its tracks in 16 bits
NOTE_NAMES = ("C", "C#", "D", "D#", "E", "F", "F#", "G", "G#", "A", "A#", "B")


def _beats(steps: int, res: int) -> str:
    """Grid steps as a fraction of a beat: 18 steps at 12 per beat -> '1 1/2'."""
    f = Fraction(steps, res)
    whole, rest = divmod(f, 1)
    return " ".join(x for x in (str(whole) if whole else "", str(rest) if rest else "") if x) or "0"


@functools.lru_cache(maxsize=1)
def _gm_names() -> list[str]:
    try:
        from pretty_midi.constants import INSTRUMENT_MAP

        return list(INSTRUMENT_MAP)
    except Exception:  # noqa: BLE001  # pragma: no cover - pretty_midi is a dependency
        return [f"Program {p}" for p in range(128)]


def _truncation(data: bytes) -> str:
    """Why a Standard MIDI File is cut short, or "" if its chunks fit: one of the header's tracks
    missing, or a chunk that declares more bytes than remain (bytes after the last track are
    ignored, as players ignore them). symusic 0.5 reads such files leniently, as if the rest were
    silence."""
    if len(data) < 14:
        return "truncated header"
    tracks = int.from_bytes(data[10:12], "big")
    pos, found = 8 + int.from_bytes(data[4:8], "big"), 0
    while found < tracks:
        if pos + 8 > len(data):
            return f"truncated: {found} of its {tracks} tracks"
        kind, length = data[pos:pos + 4], int.from_bytes(data[pos + 4:pos + 8], "big")
        if pos + 8 + length > len(data):
            if not (kind.isascii() and kind.isalnum()):  # not a chunk name: a length before it is wrong
                return f"no chunk at byte {pos:,}, where track {found + 1} of {tracks} should begin: a length before it is wrong"
            return f"truncated: a {kind.decode('latin-1')!r} chunk declares {length:,} bytes, {len(data) - pos - 8:,} remain"
        found += kind == b"MTrk"
        pos += 8 + length
    return ""


# meta events symusic reads, and the bytes each holds: one declaring fewer is read on into the
# next events' bytes (a 1-byte tempo became 130 BPM, made up of the following note-on)
_META_SIZES = {0x51: ("tempo", 3), 0x58: ("time signature", 4), 0x59: ("key signature", 2)}
_SHORT_META = re.compile(rb"\xff\x51[\x00-\x02]|\xff\x58[\x00-\x03]|\xff\x59[\x00\x01]")


def _vlq(data: bytes, i: int, end: int) -> tuple[int, int]:
    """A variable-length quantity at data[i:end]: (value, index after it)."""
    value = 0
    for _ in range(4):
        if i >= end:
            break
        b = data[i]
        value, i = (value << 7) | (b & 0x7F), i + 1
        if b < 0x80:
            break
    return value, i


def _skip_short_meta(data: bytes) -> tuple[bytes, list[str]]:
    """The file with each tempo, time or key signature shorter than its kind turned into a
    sequencer-specific event (which readers skip), and a sentence per kind. Only a file where
    such bytes may occur is walked event by event (a regular expression finds none in others)."""
    if not _SHORT_META.search(data):
        return data, []
    out, found = bytearray(data), {}
    pos, track = 8 + int.from_bytes(data[4:8], "big"), 0
    while pos + 8 <= len(data):
        kind, end = data[pos:pos + 4], min(len(data), pos + 8 + int.from_bytes(data[pos + 4:pos + 8], "big"))
        i, tick, status = pos + 8, 0, 0
        track += kind == b"MTrk"
        while kind == b"MTrk" and i < end:
            delta, i = _vlq(data, i, end)
            tick += delta
            if i >= end:
                break
            b = data[i]
            if b == 0xFF and i + 1 < end:  # meta: type, length, bytes
                length, j = _vlq(data, i + 2, end)
                what, size = _META_SIZES.get(data[i + 1], ("", 0))
                if length < size:
                    out[i + 1] = 0x7F
                    found.setdefault(what, []).append((tick, track, length, size))
                i = j + length
            elif b in (0xF0, 0xF7):  # system exclusive: length, bytes
                length, j = _vlq(data, i + 1, end)
                i = j + length
            elif b < 0xF0 and (b >= 0x80 or status):  # a channel message, or its running status
                status, i = (b, i + 1) if b >= 0x80 else (status, i)
                i += 1 if status >> 4 in (0xC, 0xD) else 2
            else:  # bytes no reader can follow: leave the rest of this track to symusic
                break
        pos += 8 + int.from_bytes(data[pos + 4:pos + 8], "big")
    notes = []
    for what, events in found.items():
        tick, track, length, size = events[0]
        more = f" (and {len(events) - 1} more)" if len(events) > 1 else ""
        notes.append(f"a {what} event of {length} byte{'s' * (length != 1)} (it needs {size}) at tick {tick} of "
                     f"track {track} is skipped{more}")
    return bytes(out), notes


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


def _round_div(a: np.ndarray, num: int, den: int) -> np.ndarray:
    """round(a * num / den), half up, exact in integers (a >= 0)."""
    return (a.astype(np.int64) * (2 * num) + den) // (2 * den)


class _Parsed:
    __slots__ = ("name", "tpq", "time", "dur", "pitch", "vel", "prog", "tempo_time", "tempo_qpm", "ts_time", "ts_num", "ts_den",
                 "chord_marks", "warnings")


def _onsets_with_chords(onsets: np.ndarray, chord_steps, last_step: int,
                        bar_starts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """The grid steps that open a Position: every note onset, and every chord change up to the last
    onset (a Position may hold only a Chord). With the Chord index at each (-1: no change there),
    or None without chord annotations. Several changes at one step: the last wins; a change to
    the chord already in force is none. With `bar_starts` (chord_every_bar) every bar line from the
    first chord on also states the chord in force there."""
    if chord_steps is None:
        return onsets, None
    cs, ci = chord_steps
    keep = cs <= last_step
    cs, ci = cs[keep], ci[keep]
    last_of_step = np.r_[cs[1:] != cs[:-1], True] if len(cs) else np.zeros(0, bool)
    cs, ci = cs[last_of_step], ci[last_of_step]
    stated = np.zeros(len(cs), bool)  # always written (bar lines), even when the chord does not change
    if bar_starts is not None and len(cs):
        k = np.searchsorted(cs, bar_starts, side="right") - 1
        bar_starts, in_force = bar_starts[k >= 0], ci[k[k >= 0]]  # (from the first chord on)
        inside = ~np.isin(cs, bar_starts)
        cs, ci = np.r_[cs[inside], bar_starts], np.r_[ci[inside], in_force]
        stated = np.r_[np.zeros(int(inside.sum()), bool), np.ones(len(bar_starts), bool)]
        order = np.argsort(cs, kind="stable")
        cs, ci, stated = cs[order], ci[order], stated[order]
    change = (np.r_[True, ci[1:] != ci[:-1]] | stated) if len(ci) else np.zeros(0, bool)
    cs, ci = cs[change], ci[change]
    steps = np.union1d(onsets, cs)
    chord_at = np.full(len(steps), -1, dtype=np.int64)
    chord_at[np.searchsorted(steps, cs)] = ci
    return steps, chord_at


def _drum_snap(res: int) -> np.ndarray:
    """(res,): for each grid step inside a beat, the step of the nearest sixteenth or eighth-note
    triplet (res: the next beat), a tie going to the sixteenth. A drummer plays a pattern's hits a
    little early or late, so at 12 steps a beat a third of the Groove set's hits land between
    these places, and a repeated pattern never repeats on the grid (docs/groove-history.md)."""
    sixteenths, triplets = range(0, res + 1, res // 4), range(0, res + 1, res // 3)
    places = sorted({*sixteenths, *triplets}, key=lambda p: (p not in sixteenths, p))
    return np.array([min(places, key=lambda p: (abs(p - r), p not in sixteenths)) for r in range(res)])


class REMITokenizer:
    """REMI tokenizer; see the module docstring for the vocabulary and grammar."""

    def __init__(self, config: TokenizerConfig | None = None):
        self.config = cfg = config if config is not None else TokenizerConfig()
        res = cfg.beat_resolution
        self.ticks_per_beat_out = res * TICKS_PER_STEP_OUT
        self.num_positions = cfg.max_bar_beats * res

        # bins
        nv = cfg.num_velocity_bins
        v = np.arange(128)
        self._vel_to_bin = np.clip((np.maximum(v, 1) - 1) * nv // 127, 0, nv - 1).astype(np.int64)
        self.velocity_values = np.array(
            [int((v[1:][self._vel_to_bin[1:] == b].min() + v[1:][self._vel_to_bin[1:] == b].max()) // 2) for b in range(nv)],
            dtype=np.int64,
        )
        nt = cfg.num_tempo_bins
        self._log_tmin = math.log(cfg.tempo_min)
        self._log_tstep = (math.log(cfg.tempo_max) - self._log_tmin) / (nt - 1) if nt > 1 else 1.0
        self.tempo_values = np.exp(self._log_tmin + self._log_tstep * np.arange(nt)) if nt > 1 else np.array([cfg.tempo_min])
        self.duration_steps = _duration_bins(res, cfg.max_duration_beats)
        top = int(self.duration_steps[-1])
        self.max_duration_steps = top
        table = np.abs(np.arange(top + 1)[:, None] - self.duration_steps[None, :])
        self._dur_to_bin = np.argmin(table, axis=1).astype(np.int64)  # ties -> shorter bin

        # time signatures
        self.time_signatures = cfg.time_signatures
        # grid steps in a bar of each time signature (by its index), for the grammar too
        self.bar_lengths = np.array([n * 4 * res // d for n, d in self.time_signatures], dtype=np.int64)
        self._ts_index = {ts: i for i, ts in enumerate(self.time_signatures)}
        by_len: dict[int, int] = {}
        for i, (_n, d) in enumerate(self.time_signatures):  # prefer the simplest (first listed ... quarter-based)
            L = int(self.bar_lengths[i])
            if L not in by_len or d == 4:
                by_len[L] = i
        self._ts_by_len = by_len

        # vocabulary
        vocab = ["PAD", "BOS", "EOS", "Bar"]
        kind = [PAD, BOS, EOS, BAR]
        value = [0, 1, 2, 0]
        self._ranges: dict[str, tuple[int, int]] = {}

        def add(name: str, items: Iterable[tuple[str, int]]) -> None:
            start = len(vocab)
            for s, val in items:
                vocab.append(f"{name}_{s}")
                kind.append(KINDS[name])
                value.append(val)
            self._ranges[name] = (start, len(vocab))

        add("TimeSig", ((f"{n}/{d}", i) for i, (n, d) in enumerate(self.time_signatures)))
        add("Position", ((str(p), p) for p in range(self.num_positions)))
        add("Tempo", ((str(i), i) for i in range(nt)))
        parts = [(name, code) for name, code in PART_CODES.items()] if cfg.parts else []
        add("Program", [(str(p), p) for p in range(128)] + [("drums", DRUMS)] + parts)
        add("Pitch", ((str(p), p) for p in range(128)))
        add("Velocity", ((str(i), i) for i in range(nv)))
        add("Duration", ((str(i), i) for i in range(len(self.duration_steps))))
        if cfg.chords:
            add("Chord", ((name, i) for i, name in enumerate(CHORD_NAMES)))
        self.vocab: list[str] = vocab
        self.token_to_id: dict[str, int] = {t: i for i, t in enumerate(vocab)}
        self.kinds = np.array(kind, dtype=np.int64)  # the kind of each id (PAD … CHORD)
        self.kinds.flags.writeable = False
        self._kind_list = kind
        self._value_list = value
        self.pad_id, self.bos_id, self.eos_id, self.bar_id = 0, 1, 2, 3
        self.drum_program_id = self._ranges["Program"][0] + DRUMS
        self._ts_first = self._ranges["TimeSig"][0]
        self._pos_first = self._ranges["Position"][0]
        self._tempo_first = self._ranges["Tempo"][0]
        self._prog_first = self._ranges["Program"][0]
        self._pitch_first = self._ranges["Pitch"][0]
        self._vel_first = self._ranges["Velocity"][0]
        self._dur_first = self._ranges["Duration"][0]
        self._chord_first = self._ranges["Chord"][0] if cfg.chords else -1
        self._drum_snap = _drum_snap(cfg.beat_resolution) if cfg.drum_grid else None
        self._chord_index = {name: i for i, name in enumerate(CHORD_NAMES)}
        self._default_ts = self.map_time_signature(4, 4)
        # the GM program each part's track plays when decoded (a user may choose others)
        self.part_programs = {code: 0 for code in PART_CODES.values()}

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return len(self.vocab)

    def __repr__(self) -> str:
        return f"REMITokenizer(vocab={len(self)}, fingerprint={self.config.fingerprint()})"

    def range(self, kind: str) -> tuple[int, int]:
        """[start, stop) id range of a token kind (one of KINDS)."""
        try:
            return self._ranges[kind]
        except KeyError:
            raise ValueError(f"unknown token kind {kind!r}; expected one of {', '.join(KINDS)}") from None

    def ids_to_tokens(self, ids) -> list[str]:
        arr = np.asarray(ids, dtype=np.int64).ravel()
        bad = (arr < 0) | (arr >= len(self.vocab))
        if bad.any():
            raise TokenError(f"token id {int(arr[bad][0])} is not in the vocabulary (size {len(self.vocab)})")
        v = self.vocab
        return [v[i] for i in arr.tolist()]

    def describe(self, token_id: int) -> str:
        """What a token's bin means, in a musician's units ("91.4 BPM", "3/4 beat", "beat 2 +
        1/2", "velocity 73", "C4"); "" where the name says it all."""
        kind, value = self.vocab[token_id].split("_", 1) if "_" in self.vocab[token_id] else (self.vocab[token_id], "")
        res = self.config.beat_resolution
        if kind == "Tempo":
            return f"{float(self.tempo_values[int(value)]):.1f} BPM"
        if kind == "Duration":
            steps = int(self.duration_steps[int(value)])
            return f"{_beats(steps, res)} beat{'s' * (steps > res)}"
        if kind == "Position":
            beat, step = divmod(int(value), res)
            return f"beat {beat + 1}" + (f" + {_beats(step, res)}" if step else "")
        if kind == "Velocity":
            return f"velocity {int(self.velocity_values[int(value)])}"
        if kind == "Pitch":
            return f"{NOTE_NAMES[int(value) % 12]}{int(value) // 12 - 1}"
        if kind == "Program" and value.isdigit():
            return _gm_names()[int(value)]
        return ""

    def instrument_name(self, program_id: int) -> str:
        """The General MIDI name of a Program token ("Electric Bass (finger)"), or "drums"."""
        lo, hi = self.range("Program")
        if not lo <= program_id < hi:
            raise ValueError(f"token {program_id} is not a Program token")
        code = self._value_list[program_id]
        if code in PART_OF_CODE:
            return PART_OF_CODE[code]
        return "drums" if program_id == self.drum_program_id else _gm_names()[code]

    def part_id(self, part: str) -> int:
        """The Program token of a part ('melody', 'bridge', 'piano'); a tokenizer without parts
        has none (ConfigError)."""
        if not self.config.parts:
            raise ConfigError("this model's tokenizer has no parts (melody, bridge, piano)")
        return self.token_to_id[f"Program_{parse_parts(part)[0]}"]

    def tokens_to_ids(self, tokens: Iterable[str]) -> np.ndarray:
        t2i = self.token_to_id
        out = []
        for tok in tokens:
            i = t2i.get(tok)
            if i is None:
                raise TokenError(f"unknown token {tok!r}")
            out.append(i)
        return np.array(out, dtype=np.int32)

    def bar_starts(self, ids) -> np.ndarray:
        """Indices of the Bar tokens in ids."""
        return np.flatnonzero(np.asarray(ids) == self.bar_id)

    # ------------------------------------------------------------------ bins
    def velocity_bin(self, velocity):
        return self._vel_to_bin[np.clip(np.asarray(velocity, dtype=np.int64), 0, 127)]

    def duration_bin(self, steps):
        """Bin index of a duration in grid steps (>= 1); longer ones are clipped to the last bin."""
        return self._dur_to_bin[np.clip(np.asarray(steps, dtype=np.int64), 1, self.max_duration_steps)]

    def tempo_bin(self, bpm):
        b = np.asarray(bpm, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.rint((np.log(np.where(b > 0, b, 120.0)) - self._log_tmin) / self._log_tstep)
        x = np.nan_to_num(x, nan=0.0, posinf=self.config.num_tempo_bins - 1, neginf=0.0)
        return np.clip(x, 0, self.config.num_tempo_bins - 1).astype(np.int64)

    @functools.lru_cache(maxsize=256)  # noqa: B019 - keeps at most 256 (tokenizer, signature) entries alive
    def map_time_signature(self, numerator: int, denominator: int) -> int:
        """Index into config.time_signatures of the allowed TS used for numerator/denominator."""
        ts = (int(numerator), int(denominator))
        if ts in self._ts_index:
            return self._ts_index[ts]
        if ts[0] < 1 or ts[1] < 1:
            ts = (4, 4)
            if ts in self._ts_index:
                return self._ts_index[ts]
        length = Fraction(4 * ts[0], ts[1])
        best, best_key = 0, None
        for i, (n, d) in enumerate(self.time_signatures):
            key = (abs(Fraction(4 * n, d) - length), abs(math.log2(d) - math.log2(ts[1])), i)
            if best_key is None or key < best_key:
                best, best_key = i, key
        return best

    # ------------------------------------------------------------------ reading
    def _read(self, midi) -> _Parsed:
        name, warnings = "<midi>", []
        if isinstance(midi, (str, os.PathLike)):
            name = str(midi)
            score, warnings = read_midi(midi)
        elif isinstance(midi, (bytes, bytearray, memoryview)):
            name = "<bytes>"
            score, warnings = self._parse_bytes(bytes(midi), name)
        elif isinstance(midi, symusic.Score):
            name = "<symusic.Score>"
            score = midi if midi.ttype == "Tick" or str(midi.ttype).lower().endswith("tick") else midi.to("tick")
            _check_time(score, name)
        elif type(midi).__module__.startswith("miditoolkit"):
            p = self._from_miditoolkit(midi)
            p.warnings = []
            return p
        else:
            raise TypeError(f"cannot encode a {type(midi).__name__}; pass a path, bytes, a miditoolkit.MidiFile "
                            "or a symusic.Score")
        p = self._from_score(score, name)
        p.warnings = warnings
        return p

    @staticmethod
    def _parse_bytes(data: bytes, name: str) -> tuple[symusic.Score, list[str]]:
        if len(data) == 0:
            raise MidiError(f"{name}: empty file")
        if not data.startswith(b"MThd"):
            if data.startswith(b"RIFF"):
                raise MidiError(f"{name}: RIFF MIDI files are not supported (bad header)")
            raise MidiError(f"{name}: not a MIDI file (bad header)")
        problem = _truncation(data)
        if problem:
            raise MidiError(f"{name}: corrupt MIDI file ({problem})")
        data, notes = _skip_short_meta(data)
        try:
            score = symusic.Score.from_midi(data)
        except Exception as e:  # noqa: BLE001 - symusic raises RuntimeError/ValueError with a C++ message
            raise MidiError(f"{name}: corrupt MIDI file ({_one_line(e)})") from None
        _check_time(score, name)
        return score, notes + _policy(score)

    def _program_code(self, track_name: str, is_drum: bool, program: int) -> int:
        """The program code of a track's notes: its part (by name, with parts), drums, or its GM program."""
        if is_drum:
            return DRUMS
        part = part_of_track(track_name) if self.config.parts else None
        return PART_CODES[part] if part else int(program)

    def _from_score(self, score: symusic.Score, name: str) -> _Parsed:
        p = _Parsed()
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
            progs.append(np.full(len(a["time"]), self._program_code(tr.name, tr.is_drum, tr.program), dtype=np.int64))
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

    def _from_miditoolkit(self, mf) -> _Parsed:
        name = "<miditoolkit.MidiFile>"
        p = _Parsed()
        p.name = name
        p.tpq = int(mf.ticks_per_beat)
        if p.tpq <= 0:
            raise MidiError(f"{name}: invalid ticks per beat ({p.tpq})")
        codes = [self._program_code(inst.name, inst.is_drum, inst.program) for inst in mf.instruments]
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

    # ------------------------------------------------------------------ encoding
    def encode(self, midi, beats=None, chords=None) -> np.ndarray:
        """Token ids (int32) of a MIDI file: path, bytes, miditoolkit.MidiFile or symusic.Score.

        beats: a beat annotation (path or :class:`~spemusic.tokens.beats.Beats`): bars then start at its
        downbeats and onsets are placed between its beats. chords: a chord annotation (path or
        list of :class:`~spemusic.tokens.chords.ChordChange`), written as Chord tokens (needs a config
        with ``chords=True``)."""
        return self.encode_with_stats(midi, beats, chords)[0]

    def encode_with_stats(self, midi, beats=None, chords=None) -> tuple[np.ndarray, dict[str, Any]]:
        """Token ids plus round-trip statistics of the quantisation.

        stats: notes (in the file), notes_encoded (always == notes: nothing is
        dropped), dropped_duplicates (always 0, kept for callers that sum it),
        duplicate_notes (notes sharing onset step, program and pitch with
        another, all kept), clipped_durations, moved_onsets (notes not on the grid),
        max_onset_error_ticks (in the file's ticks), ticks_per_beat, bars,
        tokens, ts_changes_moved (off-bar changes moved to a bar line),
        tempos_clipped (tempo events outside tempo_min..tempo_max), chord_changes (Chord tokens
        written), warnings (what the reader policy skipped or clipped, as sentences); with beats:
        beat_bars (bars by the annotation), max_onset_error_beats and
        max_onset_error_seconds (a note's onset on the grid against the original, in beats and
        in seconds; max_onset_error_ticks is then in beat_resolution * 40 ticks per beat).
        """
        p = self._read(midi)
        warnings = p.warnings
        beat_map = None
        if beats is not None:
            original_time = p.time
            p, beat_map = self.warp_to_beats(p, beats if isinstance(beats, Beats) else read_beats(beats))
        chord_steps = None
        if chords is not None:
            if not self.config.chords:
                raise ValueError("this tokenizer has no chord tokens (TokenizerConfig(chords=True))")
            changes = chords if isinstance(chords, list) else read_chords(chords)
            tempo = TempoMap(p.tpq, p.tempo_time, p.tempo_qpm) if beat_map is None else beat_map.tempo
            ticks = tempo.ticks(np.array([c.time for c in changes], dtype=np.float64))
            chord_steps = self._chord_steps(p, ticks, [c.name for c in changes], beat_map)
        elif self.config.chords and p.chord_marks:  # chord markers, as decode writes them
            ticks, names = zip(*sorted(p.chord_marks, key=lambda m: m[0]))
            chord_steps = self._chord_steps(p, np.array(ticks, dtype=np.float64), names, None)
        ids, stats = self._encode_parsed(p, chord_steps)
        if beat_map is not None:
            # each onset on the grid, back in the original file's time, against where it was
            res = self.config.beat_resolution
            step = _round_div(p.time, res, p.tpq)
            orig_beats = beat_map.beat_of(np.maximum(original_time, 0))
            tempo = beat_map.tempo
            err_sec = np.abs(tempo.seconds(beat_map.tick_of(step / res)) - tempo.seconds(np.maximum(original_time, 0)))
            stats["max_onset_error_beats"] = float(np.abs(step / res - orig_beats).max())
            stats["max_onset_error_seconds"] = float(err_sec.max())
            stats["beat_bars"] = stats["bars"]
        stats["warnings"] = warnings
        return ids, stats

    def encode_on_beats(self, midi, beats) -> tuple[np.ndarray, BeatMap]:
        """Token ids on a beat annotation (path or Beats), and the BeatMap that placed them (for
        callers that map bars back to the file's ticks, as `continue` does)."""
        p, beat_map = self.warp_to_beats(self._read(midi), beats if isinstance(beats, Beats) else read_beats(beats))
        return self._encode_parsed(p)[0], beat_map

    def warp_to_beats(self, p: _Parsed, beats: Beats) -> tuple[_Parsed, BeatMap]:
        """The parsed file on the annotated beat grid: one beat = one quarter note of
        ticks_per_beat_out ticks, a time signature n/4 at each bar of n beats, and the tempo of
        every beat from its length in seconds (so the music's timing is kept)."""
        time = np.maximum(p.time, 0)
        end = time + np.maximum(p.dur, 0)
        tempo = TempoMap(p.tpq, p.tempo_time, p.tempo_qpm)
        end_sec = float(tempo.seconds(end.max()))
        past = np.flatnonzero(beats.times > end_sec + 1.0)
        if len(past) > 1:  # one beat past the last note off is normal (it closes the last bar)
            raise MidiError(f"{beats.source}: beat {past[1] + 1} ({beats.times[past[1]]:.2f} s) and later are "
                            f"past the end of {p.name} ({end_sec:.2f} s); is it this file's annotation?")
        spacing = beats.times[-1] - beats.times[-2]
        if end_sec - beats.times[-1] > 8 * spacing:  # real annotations end within a beat of the music
            raise MidiError(f"{beats.source}: its last beat ({beats.times[-1]:.2f} s) comes "
                            f"{end_sec - beats.times[-1]:.1f} s before the end of {p.name} ({end_sec:.2f} s); "
                            "is it this file's annotation?")
        bmap = BeatMap(beats, tempo, float(time.min()), float(end.max()))
        W = self.ticks_per_beat_out
        q = _Parsed()
        q.name, q.tpq = p.name, W
        q.time = np.rint(bmap.beat_of(time) * W).astype(np.int64)
        q.dur = np.maximum(np.rint(bmap.beat_of(end) * W).astype(np.int64) - q.time, 0)
        q.pitch, q.vel, q.prog = p.pitch, p.vel, p.prog
        qpm = bmap.qpm_per_beat()
        q.tempo_time = np.arange(len(qpm), dtype=np.int64) * W
        q.tempo_qpm = qpm
        starts, lengths = bmap.bars()
        q.ts_time = starts * W
        q.ts_num = lengths
        q.ts_den = np.full(len(lengths), 4, dtype=np.int64)
        q.chord_marks = []
        return q, bmap

    def _chord_steps(self, p: _Parsed, ticks: np.ndarray, names, beat_map: BeatMap | None) -> tuple[np.ndarray, np.ndarray]:
        """(grid step, chord index) of chord changes at `ticks` of the original file, on the
        grid of p (warped to the beats when beat_map is given)."""
        idx = np.array([self._chord_index[n] for n in names], dtype=np.int64)
        res = self.config.beat_resolution
        steps = np.rint(beat_map.beat_of(ticks) * res) if beat_map is not None else np.rint(ticks * res / p.tpq)
        return np.maximum(steps, 0).astype(np.int64), idx

    def _bars(self, p: _Parsed, last_step: int, res: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Bar start steps and TS index per bar, from the time-signature map."""
        tpq = p.tpq
        segs: list[tuple[int, int]] = []
        if len(p.ts_time):
            order = np.argsort(p.ts_time, kind="stable")
            steps = _round_div(p.ts_time[order], res, tpq).tolist()
            nums = p.ts_num[order].tolist()
            dens = p.ts_den[order].tolist()
            for st, n, d in zip(steps, nums, dens):
                ti = self.map_time_signature(n, d)
                if segs and segs[-1][0] == st:
                    segs[-1] = (st, ti)  # several at one time: the last wins
                else:
                    segs.append((st, ti))
        if not segs or segs[0][0] > 0:
            segs.insert(0, (0, self._default_ts))
        segs = [s for i, s in enumerate(segs) if i == 0 or s[0] <= last_step]
        ts_len = self.bar_lengths
        starts: list[np.ndarray] = []
        tsids: list[np.ndarray] = []
        moved = 0
        cur = 0
        min_len = int(ts_len.min())
        if (last_step // min_len) + 2 > MAX_BARS:
            raise MidiError(f"{p.name}: too long (a note at beat {last_step / res:.0f})")
        for i, (_, t) in enumerate(segs):
            L = int(ts_len[t])
            if i + 1 < len(segs):
                b = segs[i + 1][0]
                if b <= cur:
                    continue  # superseded (an earlier change was moved past it)
                n_full, rem = divmod(b - cur, L)
                starts.append(np.arange(cur, cur + n_full * L, L, dtype=np.int64))
                tsids.append(np.full(n_full, t, dtype=np.int64))
                if rem:
                    tk = self._ts_by_len.get(rem)
                    end = cur + n_full * L
                    if tk is not None:  # the short bar gets the TS of its length
                        starts.append(np.array([end], dtype=np.int64))
                        tsids.append(np.array([tk], dtype=np.int64))
                        cur = b
                    else:
                        moved += 1
                        if 2 * rem < L:
                            cur = end  # move the change back to the bar line
                        else:
                            starts.append(np.array([end], dtype=np.int64))
                            tsids.append(np.array([t], dtype=np.int64))
                            cur = end + L
                else:
                    cur = b
            else:
                n = max(0, (last_step - cur) // L + 1)
                starts.append(np.arange(cur, cur + n * L, L, dtype=np.int64))
                tsids.append(np.full(n, t, dtype=np.int64))
        bar_start = np.concatenate(starts)
        bar_ts = np.concatenate(tsids)
        nbars = len(bar_start)
        if nbars > MAX_BARS:
            raise MidiError(f"{p.name}: too long ({nbars} bars)")
        return bar_start, bar_ts, moved

    def _tempo_bins_at(self, p: _Parsed, steps: np.ndarray) -> tuple[np.ndarray, int]:
        """The tempo bin in force at each grid step of `steps` (120 BPM before the first tempo), and
        how many of the file's tempos lie outside the vocabulary's range (clipped to it)."""
        cfg = self.config
        if not len(p.tempo_time):
            return np.repeat(self.tempo_bin([120.0]), len(steps)), 0
        torder = np.argsort(p.tempo_time, kind="stable")
        t_steps = np.concatenate(([-1], _round_div(np.maximum(p.tempo_time[torder], 0), cfg.beat_resolution, p.tpq)))
        qpm = p.tempo_qpm[torder]
        t_bins = np.concatenate((self.tempo_bin([120.0]), self.tempo_bin(qpm)))
        clipped = int(np.count_nonzero((qpm < cfg.tempo_min * 0.999) | (qpm > cfg.tempo_max * 1.001)))
        return t_bins[np.searchsorted(t_steps, steps, side="right") - 1], clipped

    def _encode_parsed(self, p: _Parsed, chord_steps=None) -> tuple[np.ndarray, dict[str, Any]]:
        cfg = self.config
        res = cfg.beat_resolution
        tpq = p.tpq
        n_in = len(p.time)
        time = np.maximum(p.time, 0)
        on = _round_div(time, res, tpq)
        drum = p.prog == DRUMS
        if cfg.drum_grid:  # each drum hit on its nearest sixteenth or eighth-note triplet
            on[drum] = on[drum] // res * res + self._drum_snap[on[drum] % res]
        err_num = np.abs(time * res - on * tpq)  # error in ticks * res
        moved_onsets = int(np.count_nonzero(err_num))
        max_err = float(err_num.max()) / res if n_in else 0.0
        dsteps = np.maximum(_round_div(np.maximum(p.dur, 0), res, tpq), 1)
        pitch = np.clip(p.pitch, 0, 127)
        prog = p.prog
        clipped_mask = (dsteps > self.max_duration_steps) & ~drum

        vbin = self._vel_to_bin[np.clip(p.vel, 0, 127)]
        dbin = self._dur_to_bin[np.minimum(dsteps, self.max_duration_steps)]
        # sort by (onset, program, pitch), then longest and loudest (in bins) first.  Notes that
        # share (onset, program, pitch) are kept (unison doublings across tracks, flams that
        # quantise to one step); decode puts them on separate layer tracks.
        order = np.lexsort((-vbin, -np.where(drum, 0, dbin), pitch, prog, on))  # drums: no duration
        on, prog, pitch, drum = on[order], prog[order], pitch[order], drum[order]
        vbin, dbin, clipped_mask = vbin[order], dbin[order], clipped_mask[order]
        same = (on[1:] == on[:-1]) & (prog[1:] == prog[:-1]) & (pitch[1:] == pitch[:-1])
        duplicates = int(same.sum())
        dropped = 0
        n = len(on)
        clipped = int(clipped_mask.sum())

        last_step = int(on[-1])
        bar_start, bar_ts, ts_moved = self._bars(p, last_step, res)
        nb = len(bar_start)
        ts_flag = np.ones(nb, dtype=bool)
        ts_flag[1:] = bar_ts[1:] != bar_ts[:-1]

        # sweeps: with melody_first a bar writes its melody's onsets (sweep 0), then the other
        # parts' (sweep 1, where the chords are); otherwise every onset is in sweep 1
        melody_first = cfg.melody_first
        sweep = (prog != PART_CODES["melody"]) if melody_first else np.ones(n, dtype=bool)
        # onsets: every note onset, and every chord change (a Position may hold only a Chord)
        u_step, u_sweep = np.divmod(np.unique(on * 2 + sweep), 2)
        chord_at = None
        if chord_steps is not None:
            melody_only = u_step[u_sweep == 0]
            steps1, chords1 = _onsets_with_chords(u_step[u_sweep == 1], chord_steps, last_step,
                                                  bar_start if cfg.chord_every_bar else None)
            u_step = np.concatenate((melody_only, steps1))
            u_sweep = np.r_[np.zeros(len(melody_only), np.int64), np.ones(len(steps1), np.int64)]
            chord_at = np.r_[np.full(len(melody_only), -1, np.int64), chords1]
        nu = len(u_step)
        u_bar = np.searchsorted(bar_start, u_step, side="right") - 1
        u_pos = u_step - bar_start[u_bar]
        note_bar = np.searchsorted(bar_start, on, side="right") - 1

        # tempo: on the onsets where the bin in force changes; with melody_first once per bar (the
        # bin at its bar line), since the onsets of two sweeps are not in time order
        if melody_first:
            b_tempo, tempos_clipped = self._tempo_bins_at(p, bar_start)
            bar_tempo_flag = np.r_[True, b_tempo[1:] != b_tempo[:-1]]
            tempo_flag = np.zeros(nu, dtype=bool)
        else:
            u_tempo, tempos_clipped = self._tempo_bins_at(p, u_step)
            tempo_flag = np.r_[True, u_tempo[1:] != u_tempo[:-1]] if nu else np.zeros(0, bool)
            bar_tempo_flag = np.zeros(nb, dtype=bool)

        # layout: items are bar headers, onset headers and notes, ordered by (bar, sweep, step, type, rank)
        bar_len = 1 + ts_flag.astype(np.int64) + bar_tempo_flag.astype(np.int64)
        chord_flag = chord_at >= 0 if chord_at is not None else np.zeros(nu, dtype=bool)
        on_len = 1 + chord_flag.astype(np.int64) + tempo_flag.astype(np.int64)
        note_len = 4 - drum.astype(np.int64)
        item_bar = np.concatenate((np.arange(nb, dtype=np.int64), u_bar, note_bar))
        item_sweep = np.concatenate((np.full(nb, -1, np.int64), u_sweep, sweep.astype(np.int64)))
        item_step = np.concatenate((bar_start, u_step, on))
        item_type = np.concatenate((np.zeros(nb, np.int64), np.ones(nu, np.int64), np.full(n, 2, np.int64)))
        item_rank = np.concatenate((np.zeros(nb + nu, np.int64), np.arange(n, dtype=np.int64)))
        item_len = np.concatenate((bar_len, on_len, note_len))
        iorder = np.lexsort((item_rank, item_type, item_step, item_sweep, item_bar))
        offs_sorted = np.cumsum(item_len[iorder]) - item_len[iorder] + 1  # +1 for BOS
        offs = np.empty_like(offs_sorted)
        offs[iorder] = offs_sorted
        total = int(item_len.sum()) + 2
        out = np.empty(total, dtype=np.int32)
        out[0] = self.bos_id
        out[-1] = self.eos_id
        bo, uo, no = offs[:nb], offs[nb : nb + nu], offs[nb + nu :]
        out[bo] = self.bar_id
        out[bo[ts_flag] + 1] = self._ts_first + bar_ts[ts_flag]
        if melody_first:
            out[bo[bar_tempo_flag] + 1 + ts_flag[bar_tempo_flag]] = self._tempo_first + b_tempo[bar_tempo_flag]
        out[uo] = self._pos_first + u_pos
        if chord_at is not None:
            out[uo[chord_flag] + 1] = self._chord_first + chord_at[chord_flag]
        if not melody_first:
            out[uo[tempo_flag] + 1 + chord_flag[tempo_flag]] = self._tempo_first + u_tempo[tempo_flag]
        out[no] = self._prog_first + prog
        out[no + 1] = self._pitch_first + pitch
        out[no + 2] = self._vel_first + vbin
        nd = ~drum
        out[no[nd] + 3] = self._dur_first + dbin[nd]

        stats = {
            "notes": n_in,
            "notes_encoded": n,
            "dropped_duplicates": dropped,
            "duplicate_notes": duplicates,
            "clipped_durations": clipped,
            "moved_onsets": moved_onsets,
            "max_onset_error_ticks": max_err,
            "ticks_per_beat": tpq,
            "bars": nb,
            "tokens": total,
            "ts_changes_moved": ts_moved,
            "tempos_clipped": tempos_clipped,
            "chord_changes": int(chord_flag.sum()),
        }
        return out, stats

    # ------------------------------------------------------------------ decoding
    def _decode_events(self, ids):
        """Walk ids; return note arrays (step, duration steps, pitch, velocity, program code), tempos, TSs
        and chords, each a list of (step, index)."""
        kinds, vals = self._kind_list, self._value_list
        V = len(kinds)
        ts_len = self.bar_lengths.tolist()
        cur_ts = self._default_ts
        bar_len = ts_len[cur_ts]
        bar_start = 0
        started = False
        onset = 0
        prog = pitch = vel = -1
        notes: list[tuple[int, int, int, int, int]] = []  # (step, duration steps, pitch, velocity, program)
        tempos: list[tuple[int, int]] = []  # (step, bin)
        tss: list[tuple[int, int]] = []  # (step, ts index)
        chords: list[tuple[int, int]] = []  # (step, chord index)
        vel_vals = self.velocity_values.tolist()
        dur_vals = self.duration_steps.tolist()
        if isinstance(ids, np.ndarray):
            ids = ids.ravel().tolist()
        for i in ids:
            i = int(i)
            if i < 0 or i >= V:
                continue
            k = kinds[i]
            if k == PROGRAM:
                prog, pitch, vel = vals[i], -1, -1
            elif k == PITCH:
                if prog >= 0:
                    pitch, vel = vals[i], -1
            elif k == VELOCITY:
                if pitch >= 0 and vel < 0:
                    vel = vals[i]
                    if prog == DRUMS:
                        notes.append((onset, 1, pitch, vel_vals[vel], prog))
                        prog = pitch = vel = -1
            elif k == DURATION:
                if vel >= 0 and prog != DRUMS:
                    notes.append((onset, dur_vals[vals[i]], pitch, vel_vals[vel], prog))
                prog = pitch = vel = -1
            elif k == POSITION:
                if not started:
                    started = True
                    tss.append((0, cur_ts))
                onset = bar_start + vals[i]
                prog = pitch = vel = -1
            elif k == BAR:
                if started:
                    bar_start += bar_len
                else:
                    started = True
                    tss.append((0, cur_ts))
                onset = bar_start
                prog = pitch = vel = -1
            elif k == TIMESIG:
                if not started:
                    started = True
                cur_ts = vals[i]
                bar_len = ts_len[cur_ts]
                if tss and tss[-1][0] == bar_start:
                    tss[-1] = (bar_start, cur_ts)
                elif not tss or tss[-1][1] != cur_ts:
                    tss.append((bar_start, cur_ts))
            elif k == TEMPO:
                t = vals[i]
                if tempos and tempos[-1][0] == onset:
                    tempos[-1] = (onset, t)
                elif not tempos or tempos[-1][1] != t:
                    tempos.append((onset, t))
            elif k == CHORD and (not chords or chords[-1][1] != vals[i]):  # a marker at each change
                chords.append((onset, vals[i]))
            elif k == EOS:
                break
        # merge consecutive duplicates after in-place replacement
        tss = [x for j, x in enumerate(tss) if j == 0 or x[1] != tss[j - 1][1]]
        tempos = [x for j, x in enumerate(tempos) if j == 0 or x[1] != tempos[j - 1][1]]
        if tempos:
            tempos[0] = (0, tempos[0][1])  # the first tempo holds from the start
        columns = np.array(notes, dtype=np.int64).reshape(-1, 5).T
        return tuple(np.ascontiguousarray(c) for c in columns), tempos, tss, chords

    @staticmethod
    def _layers(step: np.ndarray, dur: np.ndarray, pitch: np.ndarray, prog: np.ndarray) -> np.ndarray:
        """Layer per note: 0 unless it overlaps an earlier note of the same (program, pitch); then
        the lowest layer free at its onset. Heaps of the busy and the free layers keep this
        O(n log n), however many notes overlap."""
        n = len(step)
        layer = np.zeros(n, dtype=np.int64)
        if n < 2:
            return layer
        end = step + np.where(prog == DRUMS, 1, dur)
        key = prog * 128 + pitch
        o = np.lexsort((step, key))
        ks, ss, es = key[o], step[o], end[o]
        ov = (ks[1:] == ks[:-1]) & (ss[1:] < es[:-1])
        if not ov.any():
            return layer
        bad_keys = np.unique(ks[1:][ov])
        sel = np.flatnonzero(np.isin(ks, bad_keys))
        cur_key = -1
        busy: list[tuple[int, int]] = []  # (end, layer) of the layers sounding
        free: list[int] = []  # layers free again, lowest first
        count = 0  # layers opened for this key
        for j, k, s, e in zip(sel.tolist(), ks[sel].tolist(), ss[sel].tolist(), es[sel].tolist()):
            if k != cur_key:
                cur_key, busy, free, count = k, [], [], 0
            while busy and busy[0][0] <= s:
                heapq.heappush(free, heapq.heappop(busy)[1])
            if free:
                li = heapq.heappop(free)
            else:
                li, count = count, count + 1
            heapq.heappush(busy, (e, li))
            layer[o[j]] = li
        return layer

    @staticmethod
    def trim_overlaps(step, dur, pitch, vel, prog):
        """What a MIDI player plays: a note that starts while an earlier one of the same program
        and pitch still sounds ends that one; of notes sharing an onset, the longest (then
        loudest) is kept. Returns the notes kept, their durations shortened where needed."""
        if len(step) < 2:
            return step, dur, pitch, vel, prog
        key = prog * 128 + pitch
        o = np.lexsort((-vel, -dur, step, key))
        # of notes sharing (program, pitch, onset), the first in this order (longest, loudest) stays
        o = o[np.r_[True, (key[o][1:] != key[o][:-1]) | (step[o][1:] != step[o][:-1])]]
        ks, ss, ds = key[o], step[o], dur[o]
        same_next = np.r_[ks[1:] == ks[:-1], False]
        next_start = np.r_[ss[1:], 0]
        end = np.where(same_next, np.minimum(ss + ds, next_start), ss + ds)
        keep = end > ss
        o = o[keep]
        dur = dur.copy()
        dur[o] = (end - ss)[keep]
        o = np.sort(o)
        return step[o], dur[o], pitch[o], vel[o], prog[o]

    def count_notes(self, ids) -> int:
        """Notes the tokens form, overlapping ones included (a Pitch without its Program, Velocity
        or Duration forms none)."""
        return len(self._decode_events(ids)[0][0])

    def _notes(self, ids, overlaps: str, stats: dict[str, int] | None = None):
        if overlaps not in ("trim", "layers"):
            raise ValueError(f"overlaps must be 'trim' or 'layers', not {overlaps!r}")
        notes, tempos, tss, chords = self._decode_events(ids)
        if stats is not None:
            # every note has one Pitch token: the others are notes the decoder had to skip
            lo, hi = self.range("Pitch")
            arr = np.asarray(ids).ravel()
            stats["notes"] = len(notes[0])
            stats["lost_notes"] = int(np.count_nonzero((arr >= lo) & (arr < hi))) - stats["notes"]
        if overlaps == "trim":
            notes = self.trim_overlaps(*notes)
        return notes, tempos, tss, chords

    def _tracks(self, step, dur, pitch, vel, prog):
        """Yield (name, program, is_drum, note indices) per output track: one per program and layer."""
        names = _gm_names()
        layer = self._layers(step, dur, pitch, prog)
        combos, track_of = np.unique(prog * len(step) + layer, return_inverse=True)
        if len(combos) > MAX_MIDI_TRACKS:
            raise TokenError(f"the notes need {len(combos):,} tracks (one per program and layer of overlapping "
                             f"notes), more than a MIDI file can hold ({MAX_MIDI_TRACKS:,}); decode without "
                             "keeping the overlaps")
        order = np.argsort(track_of, kind="stable")  # each track's notes, in their order, without a mask per track
        bounds = np.searchsorted(track_of[order], np.arange(len(combos) + 1))
        for t, c in enumerate(combos.tolist()):
            pc, li = divmod(c, len(step))
            drum = pc == DRUMS
            part = PART_OF_CODE.get(pc)
            name = "Drums" if drum else part.upper() if part else names[pc]
            if li:
                name = f"{name} (layer {li + 1})"
            program = 0 if drum else self.part_programs[pc] if part else pc
            yield name, program, drum, order[bounds[t]:bounds[t + 1]]

    @staticmethod
    def chord_mark(index: int) -> str:
        """Marker text of a chord (its vocabulary name; N.C. for no chord)."""
        name = CHORD_NAMES[index]
        return NO_CHORD_MARK if name == CHORD_NAMES[-1] else name

    def _tempo_mspq(self, b: int) -> int:
        return int(round(6e7 / float(self.tempo_values[b])))

    def decode_to_score(self, ids, overlaps: str = "trim") -> symusic.Score:
        """Decode ids to a symusic Score (ticks_per_quarter = beat_resolution * 40).

        overlaps="trim" (default): a note overlapping an earlier one of the same program and
        pitch ends it, one track per program (what MIDI players do anyway). "layers": every
        note keeps its duration, the overlapping ones on extra "layer" tracks (lossless:
        encode(decode(ids, overlaps="layers")) == ids)."""
        return self.decode_with_stats(ids, overlaps)[0]

    def decode_with_stats(self, ids, overlaps: str = "trim") -> tuple[symusic.Score, dict[str, int]]:
        """decode_to_score, plus what became of the notes: notes (formed by the tokens,
        overlapping ones included) and lost_notes (Pitch tokens that formed none: a Pitch
        without its Program, Velocity or Duration, or after EOS)."""
        stats: dict[str, int] = {}
        (step, dur, pitch, vel, prog), tempos, tss, chords = self._notes(ids, overlaps, stats)
        k = TICKS_PER_STEP_OUT
        last = max(int((step + dur).max(initial=0)), max((s for s, _ in tempos + tss + chords), default=0)) * k
        # a MIDI delta time has at most 28 bits: a later event would be written wrapped around, at
        # the wrong time (bounding the whole piece is simpler: 2^28 ticks are 77 h at 120 BPM)
        if last > MAX_MIDI_TICK:
            raise TokenError(f"the tokens reach tick {last:,}, beyond what a MIDI file can hold ({MAX_MIDI_TICK:,}); "
                             "split them into shorter pieces")
        score = symusic.Score(self.ticks_per_beat_out)
        for s, c in chords:  # chord symbols as markers: DAWs show them, encode reads them back
            score.markers.append(symusic.TextMeta(s * k, self.chord_mark(c)))
        for name, program, drum, m in self._tracks(step, dur, pitch, vel, prog):
            tr = symusic.Track(name=name, program=program, is_drum=drum)
            tr.notes = symusic.Note.from_numpy(
                (step[m] * k).astype(np.int32),
                (dur[m] * k).astype(np.int32),
                pitch[m].astype(np.int8),
                vel[m].astype(np.int8),
                ttype="tick",
            )
            score.tracks.append(tr)
        if tempos:
            score.tempos = symusic.Tempo.from_numpy(
                np.array([s * k for s, _ in tempos], dtype=np.int32),
                np.array([self._tempo_mspq(b) for _, b in tempos], dtype=np.int32),
                ttype="tick",
            )
        if tss:
            score.time_signatures = symusic.TimeSignature.from_numpy(
                np.array([s * k for s, _ in tss], dtype=np.int32),
                np.array([self.time_signatures[t][0] for _, t in tss], dtype=np.uint8),
                np.array([self.time_signatures[t][1] for _, t in tss], dtype=np.uint8),
                ttype="tick",
            )
        return score, stats

    def decode(self, ids, overlaps: str = "trim"):
        """Decode ids to a miditoolkit.MidiFile (ticks_per_beat = beat_resolution * 40); overlaps
        as in decode_to_score."""
        from miditoolkit import Instrument, Marker, MidiFile, Note, TempoChange, TimeSignature

        (step, dur, pitch, vel, prog), tempos, tss, chords = self._notes(ids, overlaps)
        k = TICKS_PER_STEP_OUT
        mf = MidiFile(ticks_per_beat=self.ticks_per_beat_out)
        mf.markers = [Marker(self.chord_mark(c), s * k) for s, c in chords]
        for name, program, drum, m in self._tracks(step, dur, pitch, vel, prog):
            inst = Instrument(program=program, is_drum=drum, name=name)
            inst.notes = [
                Note(velocity=v, pitch=p, start=s * k, end=(s + d) * k)
                for s, d, p, v in zip(step[m].tolist(), dur[m].tolist(), pitch[m].tolist(), vel[m].tolist())
            ]
            mf.instruments.append(inst)
        mf.tempo_changes = [TempoChange(6e7 / self._tempo_mspq(b), s * k) for s, b in tempos]
        mf.time_signature_changes = [TimeSignature(*self.time_signatures[t], s * k) for s, t in tss]
        mf.max_tick = int(max(((step + dur) * k).max(initial=0), 0))
        return mf

    def write_midi(self, ids, path, overlaps: str = "trim") -> None:
        """Decode ids and write a MIDI file atomically (temporary file + os.replace)."""
        data = self.decode_to_score(ids, overlaps).dumps_midi()
        write_atomically(data, path)
