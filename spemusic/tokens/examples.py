"""Small MIDI pieces composed in code: example prompts for the README and fixtures for tests."""

from __future__ import annotations

import miditoolkit

TICKS = 480
KICK, SNARE, CLOSED_HAT, OPEN_HAT = 36, 38, 42, 46


def drum_groove(bars: int = 2, tempo: float = 100.0) -> miditoolkit.MidiFile:
    """A two-bar rock groove in 4/4 on the GM drum map: kick on 1 and 3 (plus an 'and'), snare on
    2 and 4, closed hi-hat eighths with accents, an open hat at the end of every second bar."""
    midi = miditoolkit.MidiFile(ticks_per_beat=TICKS)
    midi.tempo_changes = [miditoolkit.TempoChange(tempo, 0)]
    midi.time_signature_changes = [miditoolkit.TimeSignature(4, 4, 0)]
    drums = miditoolkit.Instrument(program=0, is_drum=True, name="Drums")
    eighth = TICKS // 2
    for bar in range(bars):
        start = bar * 4 * TICKS
        for i in range(8):
            t = start + i * eighth
            last = bar % 2 == 1 and i == 7
            drums.notes.append(miditoolkit.Note(100 if i % 2 == 0 else 70, OPEN_HAT if last else CLOSED_HAT, t, t + 60))
        for beat, pitch, vel in ((0, KICK, 110), (1, SNARE, 105), (2, KICK, 100), (3, SNARE, 108)):
            t = start + beat * TICKS
            drums.notes.append(miditoolkit.Note(vel, pitch, t, t + 60))
        t = start + 2 * TICKS + eighth + (bar % 2) * TICKS  # syncopated kick
        drums.notes.append(miditoolkit.Note(85, KICK, t, t + 60))
    drums.notes.sort(key=lambda n: (n.start, n.pitch))
    midi.instruments = [drums]
    return midi


def piano_phrase(tempo: float = 92.0) -> miditoolkit.MidiFile:
    """Four bars of piano in C major (I-vi-IV-V): a melody over broken left-hand chords."""
    midi = miditoolkit.MidiFile(ticks_per_beat=TICKS)
    midi.tempo_changes = [miditoolkit.TempoChange(tempo, 0)]
    midi.time_signature_changes = [miditoolkit.TimeSignature(4, 4, 0)]
    piano = miditoolkit.Instrument(program=0, is_drum=False, name="Piano")
    chords = [(48, 52, 55), (45, 48, 52), (41, 45, 48), (43, 47, 50)]  # C, Am, F, G
    melody = [  # (bar, beat, pitch, beats)
        (0, 0, 76, 1), (0, 1, 74, 0.5), (0, 1.5, 72, 0.5), (0, 2, 74, 1), (0, 3, 76, 1),
        (1, 0, 72, 1.5), (1, 1.5, 71, 0.5), (1, 2, 69, 2),
        (2, 0, 69, 1), (2, 1, 72, 1), (2, 2, 77, 1), (2, 3, 76, 0.5), (2, 3.5, 74, 0.5),
        (3, 0, 74, 2), (3, 2, 71, 1), (3, 3, 67, 1),
    ]
    for bar, beat, pitch, beats in melody:
        t = round((bar * 4 + beat) * TICKS)
        piano.notes.append(miditoolkit.Note(88, pitch, t, t + round(beats * TICKS) - 10))
    for bar, chord in enumerate(chords):
        for i, pitch in enumerate((chord[0], chord[1], chord[2], chord[1]) * 2):
            t = (bar * 4 * 2 + i) * TICKS // 2
            piano.notes.append(miditoolkit.Note(62, pitch, t, t + TICKS // 2))
    piano.notes.sort(key=lambda n: (n.start, n.pitch))
    midi.instruments = [piano]
    return midi


def melody_line(tempo: float = 96.0) -> miditoolkit.MidiFile:
    """Eight bars of a sung-style melody in C major, one track named Melody: a prompt for
    `spemusic accompany` (two four-bar phrases, the second answering the first)."""
    midi = miditoolkit.MidiFile(ticks_per_beat=TICKS)
    midi.tempo_changes = [miditoolkit.TempoChange(tempo, 0)]
    midi.time_signature_changes = [miditoolkit.TimeSignature(4, 4, 0)]
    lead = miditoolkit.Instrument(program=0, is_drum=False, name="Melody")
    tune = [  # (start beat, pitch, beats)
        (0, 64, 1), (1, 67, 1), (2, 69, 1.5), (3.5, 67, 0.5),
        (4, 64, 1), (5, 62, 1), (6, 60, 2),
        (8, 62, 1), (9, 64, 1), (10, 65, 1.5), (11.5, 64, 0.5),
        (12, 62, 3),
        (16, 64, 1), (17, 67, 1), (18, 72, 1.5), (19.5, 71, 0.5),
        (20, 69, 1), (21, 67, 1), (22, 65, 2),
        (24, 64, 1), (25, 62, 1), (26, 65, 1), (27, 64, 1),
        (28, 60, 3),
    ]
    for beat, pitch, beats in tune:
        t = round(beat * TICKS)
        lead.notes.append(miditoolkit.Note(84, pitch, t, t + round(beats * TICKS) - 20))
    midi.instruments = [lead]
    return midi
