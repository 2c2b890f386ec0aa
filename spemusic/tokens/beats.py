"""Beat annotations: where the beats and the bars of a MIDI file really are.

A MIDI file's time signatures are often not its music's (POP909's say 1/4 or 2/4 where the
music is in 4/4), and its tempo map may not put beats on quarter notes. A beat annotation
fixes both: the tokenizer takes bars from the annotated downbeats and places every onset
between the two annotated beats around it (:class:`BeatMap`), as the Pop Music
Transformer's REMI took them from a beat tracker.

Two text formats are read, both with times in seconds (MIDI time, on the file's tempo map):

* POP909's ``beat_midi.txt``, three columns: ``time``, ``1`` on every other beat, ``1`` on
  each downbeat;
* the two-column ``time  beat-in-bar`` form of madmom, Ballroom and GTZAN (``1`` on a
  downbeat, ``2``, ``3``... on the other beats).

Columns may be separated by spaces, tabs or commas; blank lines and ``#`` comments are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import MidiError

__all__ = ["Beats", "AnnotationError", "read_beats", "parse_beats", "TempoMap", "BeatMap"]

MAX_BAR_BEATS = 8  # longest bar the default vocabulary holds (8/4)


class AnnotationError(MidiError):
    """A beat or chord annotation that cannot be read or does not fit its MIDI file."""


@dataclass(frozen=True)
class Beats:
    """Annotated beats: times in seconds (strictly increasing) and which of them are downbeats."""

    times: np.ndarray
    downbeat: np.ndarray
    source: str = "<beats>"


def read_annotation(path, what: str) -> str:
    """The text of an annotation file; a missing or unreadable one is an AnnotationError."""
    path = Path(path)
    try:
        return path.read_text()
    except FileNotFoundError:
        raise AnnotationError(f"{path}: no such {what} file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise AnnotationError(f"{path}: cannot read {what} file ({getattr(e, 'strerror', None) or e})") from None


def _rows(text: str) -> list[tuple[int, list[str]]]:
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].replace(",", " ").strip()
        if line:
            rows.append((n, line.split()))
    return rows


MIN_BEAT_SECONDS = 0.05  # 1,200 beats per minute: POP909's closest beats are 0.38 s apart


def parse_beats(text: str, source: str = "<beats>") -> Beats:
    """Read a beat annotation (see the module docstring for the formats)."""
    rows = _rows(text)
    if not rows:
        raise AnnotationError(f"{source}: empty beat annotation")
    ncol = len(rows[0][1])
    if ncol not in (2, 3):
        raise AnnotationError(f"{source} line {rows[0][0]}: unknown beat format ({ncol} columns; expected "
                              "'time beat-in-bar' or POP909's 'time half-bar downbeat')")
    times, down = np.empty(len(rows)), np.empty(len(rows), dtype=bool)
    for i, (n, cols) in enumerate(rows):
        if len(cols) != ncol:
            raise AnnotationError(f"{source} line {n}: {len(cols)} columns where the file has {ncol}")
        try:
            vals = [float(c) for c in cols]
        except ValueError:
            raise AnnotationError(f"{source} line {n}: not a number ({' '.join(cols)!r})") from None
        if not np.isfinite(vals).all() or vals[0] < 0:
            raise AnnotationError(f"{source} line {n}: bad time {cols[0]!r}")
        times[i] = vals[0]
        down[i] = (vals[2] == 1) if ncol == 3 else (round(vals[1]) == 1)
        if i and times[i] <= times[i - 1]:
            raise AnnotationError(f"{source} line {n}: times not increasing ({cols[0]} after {times[i - 1]:g})")
    if len(times) < 2:
        raise AnnotationError(f"{source}: needs at least two beats")
    close = np.flatnonzero(np.diff(times) < MIN_BEAT_SECONDS)
    if len(close):  # (a beat every 10 ms would make a bar of every note, and a grid of millions)
        n = rows[close[0] + 1][0]
        raise AnnotationError(f"{source} line {n}: a beat {times[close[0] + 1] - times[close[0]]:.3g} s after the one "
                              f"before, faster than {60 / MIN_BEAT_SECONDS:,.0f} beats per minute; is it a beat "
                              "annotation?")
    if not down.any():
        raise AnnotationError(f"{source}: no downbeat (no beat marked as the first of a bar)")
    return Beats(times, down, source)


def read_beats(path) -> Beats:
    return parse_beats(read_annotation(path, "beat"), str(path))


class TempoMap:
    """Seconds <-> ticks on a file's tempo map (MIDI's 120 BPM before the first tempo event)."""

    def __init__(self, tpq: int, tempo_time, tempo_qpm):
        order = np.argsort(np.asarray(tempo_time), kind="stable")
        self.tick = np.concatenate(([0.0], np.asarray(tempo_time, dtype=np.float64)[order]))
        qpm = np.concatenate(([120.0], np.asarray(tempo_qpm, dtype=np.float64)[order]))
        qpm = np.where(np.isfinite(qpm) & (qpm > 0), qpm, 120.0)
        self.sec_per_tick = 60.0 / (qpm * tpq)
        self.sec = np.concatenate(([0.0], np.cumsum(np.diff(self.tick) * self.sec_per_tick[:-1])))

    def ticks(self, seconds) -> np.ndarray:
        s = np.asarray(seconds, dtype=np.float64)
        i = np.searchsorted(self.sec, s, side="right") - 1
        return self.tick[i] + (s - self.sec[i]) / self.sec_per_tick[i]

    def seconds(self, ticks) -> np.ndarray:
        t = np.asarray(ticks, dtype=np.float64)
        i = np.clip(np.searchsorted(self.tick, t, side="right") - 1, 0, None)
        return self.sec[i] + (t - self.tick[i]) * self.sec_per_tick[i]


def _bar_lines(down: np.ndarray, num_beats: int) -> np.ndarray:
    """Bar lines (in beats) from downbeat indices: a pickup before the first downbeat, a bar per
    downbeat, and bars of the last bar's length after the last one up to num_beats. A span longer
    than MAX_BAR_BEATS (a missed downbeat) is cut into 4-beat bars; its remainder goes first in
    the pickup (an anacrusis) and last elsewhere."""
    def cut(a: int, b: int, remainder_first: bool) -> list[int]:
        n = b - a
        if n <= MAX_BAR_BEATS:
            return [a]
        r = n % 4
        if remainder_first and r:
            return [a] + list(range(a + r, b, 4))
        return list(range(a, b - r, 4)) + ([b - r] if r else [])

    lines: list[int] = []
    if down[0] > 0:
        lines += cut(0, int(down[0]), True)
    for a, b in zip(down[:-1].tolist(), down[1:].tolist()):
        lines += cut(a, b, False)
    tail = int(down[-1] - down[-2]) if len(down) > 1 else 4
    tail = tail if tail <= MAX_BAR_BEATS else 4
    k = int(down[-1])
    while k < num_beats:
        lines.append(k)
        k += tail
    lines.append(k)
    return np.array(lines, dtype=np.int64)


class BeatMap:
    """The annotated beats of one file in its ticks, extended at both ends to cover its notes.

    The warped time axis counts beats from the start of the first bar: the pickup bar (notes
    before the first downbeat; whole beats back from it) or the first downbeat. Bars start at
    the downbeats (see _bar_lines). Beats before the first annotated one and after the last are
    extrapolated at the first and last annotated spacing.
    """

    def __init__(self, beats: Beats, tempo: TempoMap, first_tick: float, last_tick: float):
        self.source = beats.source
        self.tempo = tempo
        ticks = tempo.ticks(beats.times)
        if ticks[0] > last_tick:
            raise AnnotationError(f"{beats.source} line 1: the first beat ({beats.times[0]:.3f} s) comes after "
                                  "the file's last note")
        down = np.flatnonzero(beats.downbeat)
        step0, step1 = ticks[1] - ticks[0], ticks[-1] - ticks[-2]
        # (a note a hair before the first beat, from rounding the annotation's seconds, is on it)
        n_before = int(max(0, np.ceil((ticks[0] - first_tick) / step0 - 0.01)))
        n_after = int(max(0, np.ceil((last_tick - ticks[-1]) / step1 - 0.01))) + 1
        grid = np.concatenate((ticks[0] - step0 * np.arange(n_before, 0, -1), ticks,
                               ticks[-1] + step1 * np.arange(1, n_after + 1)))
        down = down + n_before
        first_note_beat = int(np.searchsorted(grid, first_tick, side="right") - 1)
        origin = min(max(first_note_beat, 0), int(down[0]))
        down = down - origin
        num_beats = len(grid) - origin - 1
        self.bar_lines = _bar_lines(down, num_beats)  # the last one closes the last bar
        # the grid must reach the last bar line
        extra = int(self.bar_lines[-1]) - num_beats
        if extra > 0:
            grid = np.concatenate((grid, grid[-1] + step1 * np.arange(1, extra + 1)))
        self.ticks = grid[origin:]  # tick of warped beat k

    def beat_of(self, ticks) -> np.ndarray:
        """Warped position in beats (float) of file ticks: the place between the two beats around it."""
        t = np.asarray(ticks, dtype=np.float64)
        g = self.ticks
        i = np.clip(np.searchsorted(g, t, side="right") - 1, 0, len(g) - 2)
        return i + (t - g[i]) / (g[i + 1] - g[i])

    def tick_of(self, beats) -> np.ndarray:
        """File ticks (float) of warped positions in beats; the inverse of beat_of."""
        b = np.asarray(beats, dtype=np.float64)
        g = self.ticks
        i = np.clip(np.floor(b).astype(np.int64), 0, len(g) - 2)
        return g[i] + (b - i) * (g[i + 1] - g[i])

    def bars(self) -> tuple[np.ndarray, np.ndarray]:
        """(start beat, length in beats) of every bar."""
        return self.bar_lines[:-1], np.diff(self.bar_lines)

    def qpm_per_beat(self) -> np.ndarray:
        """Tempo of every warped beat in beats per minute, from its length in seconds."""
        return 60.0 / np.diff(self.tempo.seconds(self.ticks))
