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

With ``repeats`` (melody_first only) each sweep opens on a Repeat mark, appended to the vocabulary
as ``Repeat_0``, ``Repeat_1``, ``Repeat_2``, ``Repeat_4``, ``Repeat_8``: ``Bar [TimeSig] [Tempo]
Repeat_m``, the melody's onsets, ``Repeat_a``, the other parts' onsets. A mark names the bar that
sweep repeats, that many bars back (0: none), read off the notes (:mod:`spemusic.tokens.repeats`):
the model chooses to repeat a bar before it writes the bar's notes. Decoding drops the marks;
encoding the decoded file writes them again.

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

from typing import Any

import numpy as np
import symusic

from spemusic.tokens import decoding, encoding
from spemusic.tokens.beats import BeatMap, Beats

# (some re-exported: the rest of spemusic, the tests and the benchmarks import them from here)
from spemusic.tokens.file_policy import MAX_BARS, Parsed, parse_midi_bytes, read_midi, read_parsed, read_score  # noqa: F401
from spemusic.tokens.vocabulary import (  # noqa: F401
    BAR,
    BOS,
    CHORD,
    DRUMS,
    DURATION,
    EOS,
    KINDS,
    PAD,
    PART_CODES,
    PARTS,
    PITCH,
    POSITION,
    PROGRAM,
    REPEAT,
    REPEAT_LAGS,
    TEMPO,
    TIMESIG,
    VELOCITY,
    TokenError,
    TokenizerConfig,
    Vocabulary,
    default_time_signatures,
    parse_part_programs,
    parse_parts,
    part_of_track,
)

__all__ = ["TokenizerConfig", "REMITokenizer", "TokenError", "default_time_signatures"]


class REMITokenizer(Vocabulary):
    """REMI tokenizer; see the module docstring for the vocabulary and grammar.

    A facade: the token table and its ids are its :class:`~spemusic.tokens.vocabulary.Vocabulary`;
    reading MIDI is :mod:`spemusic.tokens.file_policy` (after :mod:`spemusic.tokens.midi_repair`),
    encoding :mod:`spemusic.tokens.encoding` and decoding :mod:`spemusic.tokens.decoding`, whose
    functions its methods call."""

    def __repr__(self) -> str:
        return f"REMITokenizer(vocab={len(self)}, fingerprint={self.config.fingerprint()})"

    # ------------------------------------------------------------------ reading
    _parse_bytes = staticmethod(parse_midi_bytes)

    def _read(self, midi) -> Parsed:
        return read_parsed(self, midi)

    # ------------------------------------------------------------------ encoding
    def encode(self, midi, beats=None, chords=None) -> np.ndarray:
        """Token ids (int32) of a MIDI file: path, bytes, miditoolkit.MidiFile or symusic.Score
        (:func:`spemusic.tokens.encoding.encode`: beats and chords annotations)."""
        return encoding.encode(self, midi, beats, chords)

    def encode_with_stats(self, midi, beats=None, chords=None) -> tuple[np.ndarray, dict[str, Any]]:
        """Token ids plus round-trip statistics of the quantisation
        (:func:`spemusic.tokens.encoding.encode_with_stats` lists them)."""
        return encoding.encode_with_stats(self, midi, beats, chords)

    def encode_on_beats(self, midi, beats) -> tuple[np.ndarray, BeatMap]:
        """Token ids on a beat annotation (path or Beats), and the BeatMap that placed them
        (:func:`spemusic.tokens.encoding.encode_on_beats`)."""
        return encoding.encode_on_beats(self, midi, beats)

    def warp_to_beats(self, p: Parsed, beats: Beats) -> tuple[Parsed, BeatMap]:
        """The parsed file on the annotated beat grid (:func:`spemusic.tokens.encoding.warp_to_beats`)."""
        return encoding.warp_to_beats(self, p, beats)

    def _encode_parsed(self, p: Parsed, chord_steps=None) -> tuple[np.ndarray, dict[str, Any]]:
        return encoding.encode_parsed(self, p, chord_steps)

    # ------------------------------------------------------------------ decoding
    _layers = staticmethod(decoding.layers)
    trim_overlaps = staticmethod(decoding.trim_overlaps)
    chord_mark = staticmethod(decoding.chord_mark)

    def count_notes(self, ids) -> int:
        """Notes the tokens form, overlapping ones included (:func:`spemusic.tokens.decoding.count_notes`)."""
        return decoding.count_notes(self, ids)

    def decode_to_score(self, ids, overlaps: str = "trim") -> symusic.Score:
        """Decode ids to a symusic Score (ticks_per_quarter = beat_resolution * 40); overlaps "trim" or
        "layers" (:func:`spemusic.tokens.decoding.decode_to_score`)."""
        return decoding.decode_to_score(self, ids, overlaps)

    def decode_with_stats(self, ids, overlaps: str = "trim") -> tuple[symusic.Score, dict[str, int]]:
        """decode_to_score, plus notes and lost_notes (:func:`spemusic.tokens.decoding.decode_with_stats`)."""
        return decoding.decode_with_stats(self, ids, overlaps)

    def decode(self, ids, overlaps: str = "trim"):
        """Decode ids to a miditoolkit.MidiFile (:func:`spemusic.tokens.decoding.decode`)."""
        return decoding.decode(self, ids, overlaps)

    def write_midi(self, ids, path, overlaps: str = "trim") -> None:
        """Decode ids and write a MIDI file atomically (:func:`spemusic.tokens.decoding.write_midi`)."""
        decoding.write_midi(self, ids, path, overlaps)
