"""Harmonize a melody: one chord per bar, from the whole melody at once (a hidden Markov model).

`spemusic accompany` plays chords under a melody. The Performer names each chord from the bars
before it only, and then follows its own key rather than the melody's (docs/pop-piano-history.md).
A chord chart drawn from the whole melody, as a musician drafts one before playing, is the
missing step.

The model is the classic one for melody harmonization: the chords are the hidden states and a
bar's melody notes are what each chord emits; but the song's key is hidden too, so the states are
(key, chord) pairs. Every table is written in C (major or minor) and read in all 24 keys, so every
key is the same to it:

- the melody: where a note falls in the bar says how much it tells of the chord (a note on the
  downbeat is nearly always a chord tone, an off-beat one often a passing tone; the second half of
  a bar often belongs to a second chord, the bar's label being the first of two), so a bar's melody
  is a histogram per metrical position (downbeat, other beats and off-beats of each half, the
  middle of the bar, and notes held over the bar line), each note counted by the square root of its
  beats (a long note is more of the harmony than a short one, not proportionally more). For each
  chord of the key (I, V, vi, ... in major or minor) and position, the share of that melody at each
  pitch class of the key: a chord's own tones and the scale around it differ by the chord's place
  in the key (the melody over a IV is not the melody over a I, a fourth up). Rare chords borrow
  their shape: the counts are smoothed towards the chord quality's melody above its root (every
  key and root pooled), weighing as much as `backoff` counted notes;
- the progression: the next chord given the last one, in the key (pop progressions are
  key-relative: I-V-vi-IV), per mode, and the first chord;
- the key: uniform at the start, and a small chance per bar to change (a modulation, typically
  up a step for the last chorus).

The chart is the chord with the highest posterior probability in each bar (forward-backward over
the whole melody, every key and its chords), summed over keys: the right choice for the most bars
right, where the single best path (Viterbi) chooses the best whole sequence.

The tables are counts over a token cache's train split (bars with their melody notes and the
chord that covers most of each; transitions smoothed by 0.1 so that a rare progression stays
possible). The training songs' keys are unknown: they start as the Krumhansl-Kessler key of the
melody, and are then re-estimated twice as the key in which the song's own chords and melody are
most likely under the tables (hard EM). `python -m spemusic.training.fit_harmony CACHE OUT.json` writes them;
the emission weight (nats of the melody against the progression's), the backoff and the key-change
rate were chosen by cross-validation on the train split.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SpemusicError
from ..tokens.chords import CHORD_NAMES, NO_CHORD, QUALITIES

Q = tuple(QUALITIES)        # qualities, in vocabulary order
N_STATES = len(CHORD_NAMES)  # 12 roots x qualities, then N
NONE = N_STATES - 1
FORMAT = "spemusic-harmony"
VERSION = 2
# metrical positions of melody notes (for 4/4: 0 on beat 1, 1 on beat 2, 2 between beats 1 and 3,
# 3 on beat 3, 4 on beat 4, 5 between beats 3 and the bar line, 6 held over from the bar before)
POSITIONS = ("downbeat", "first-half beat", "first-half off-beat", "mid-bar", "second-half beat",
             "second-half off-beat", "held over")
N_POS = len(POSITIONS)
# the triad a chord is heard as, for the triad-level match: its root and third (sus chords: major)
TRIAD = {"maj": "maj", "aug": "maj", "7": "maj", "maj7": "maj", "sus2": "maj", "sus4": "maj",
         "min": "min", "min7": "min", "dim": "min"}


@dataclass
class BarData:
    """Per bar of a piece: the melody's time at each pitch class (beats), the chord that covers most
    of the bar (an index into CHORD_NAMES), and the melody by metrical position (see POSITIONS;
    the square root of each note's beats in the bar)."""
    melody: np.ndarray   # (bars, 12)
    chords: np.ndarray   # (bars,)
    metric: np.ndarray | None = None  # (bars, N_POS, 12)


def bars_of(ids, tokenizer) -> BarData:
    """The bars of a token sequence with chords (as written by a tokenizer with parts and chords)."""
    from .metrics import note_grid

    g = note_grid(ids, tokenizer)
    starts, ends = g.bar_start, g.bar_start + g.bar_len
    sel = g.prog == tokenizer.part_id("melody")
    bar, onset, pos, pc = g.bar[sel], g.onset[sel], g.pos[sel], g.pitch[sel] % 12
    end = onset + np.maximum(g.dur[sel], 1)
    inside = np.minimum(end, ends[bar]) - onset  # each note up to its bar's end
    melody = np.zeros((g.n_bars, 12))
    np.add.at(melody, (bar, pc), inside / g.res)
    # by metrical position; the part of a note past its bar line counts in the next bar
    length = g.bar_len[bar]
    first, on_beat = 2 * pos < length, pos % g.res == 0
    cls = np.where(pos == 0, 0, np.where(first, np.where(on_beat, 1, 2),
                                         np.where(2 * pos == length, 3, np.where(on_beat, 4, 5))))
    metric = np.zeros((g.n_bars, N_POS, 12))
    np.add.at(metric, (bar, cls, pc), np.sqrt(inside / g.res))
    over = (end > ends[bar]) & (bar + 1 < g.n_bars)
    nxt = bar[over] + 1
    np.add.at(metric, (nxt, N_POS - 1, pc[over]), np.sqrt((np.minimum(end[over], ends[nxt]) - starts[nxt]) / g.res))
    # the chord that covers most of each bar (N before the first; a tie: the earlier one)
    change_at = np.asarray(g.chord_step, dtype=np.int64)
    names = np.array([CHORD_NAMES.index(n) for n in g.chord_name] + [CHORD_NAMES.index(NO_CHORD)])  # [-1]: N
    chords = np.empty(g.n_bars, dtype=np.int64)
    for b, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
        cuts = np.r_[s, change_at[(change_at > s) & (change_at < e)], e]
        in_force = names[np.searchsorted(change_at, cuts[:-1], side="right") - 1]
        cover = dict.fromkeys(in_force.tolist(), 0)  # (in order of appearance)
        for chord, length in zip(in_force.tolist(), np.diff(cuts).tolist()):
            cover[chord] += length
        chords[b] = max(cover, key=cover.get)
    return BarData(melody, chords, metric)


def melody_key(melody: np.ndarray) -> tuple[int, int]:
    """(tonic pitch class, mode: 0 major, 1 minor) of a whole melody (beats per pitch class per
    bar): the Krumhansl-Kessler profile it correlates with best (C major without notes)."""
    from .metrics import KK_MAJOR, KK_MINOR

    h = np.asarray(melody, dtype=np.float64).sum(0)
    if h.sum() <= 0 or np.all(h == h[0]):
        return 0, 0
    scores = [(np.corrcoef(h, np.roll(p, k))[0, 1], k, mode) for mode, p in enumerate((KK_MAJOR, KK_MINOR))
              for k in range(12)]
    _, tonic, mode = max(scores)
    return tonic, mode


def _rotation(shift: int) -> np.ndarray:
    """CHORD_NAMES indices with their roots moved by `shift` semitones (N stays N)."""
    root, q = np.divmod(np.arange(N_STATES - 1), len(Q))
    return np.r_[((root + shift) % 12) * len(Q) + q, NONE]


def _positions(melody) -> np.ndarray:
    """(bars, N_POS, 12) from a BarData or an array; a (bars, 12) histogram without positions
    counts as notes on the downbeat (as strong as a note can be)."""
    if isinstance(melody, BarData):
        melody = melody.metric if melody.metric is not None else melody.melody
    m = np.asarray(melody, dtype=np.float64)
    if m.ndim == 2 and m.shape[-1] == 12:
        out = np.zeros((len(m), N_POS, 12))
        out[:, 0] = m
        return out
    if m.ndim != 3 or m.shape[1:] != (N_POS, 12):
        raise SpemusicError(f"a melody of shape {m.shape}: expected (bars, 12) or (bars, {N_POS}, 12)")
    return m


class Harmonizer:
    """Chord tables in the key of C (see the module notes) and the chart of a melody."""

    def __init__(self, key_counts: np.ndarray, interval_counts: np.ndarray, transition_counts: np.ndarray,
                 start_counts: np.ndarray, emission_weight: float = 1.0, backoff: float = 100.0,
                 key_change: float = 0.01):
        self.key_counts = np.asarray(key_counts, dtype=np.float64)                # (2, S, P, 12): per mode, in C
        self.interval_counts = np.asarray(interval_counts, dtype=np.float64)      # (Q, P, 12): over the root
        self.transition_counts = np.asarray(transition_counts, dtype=np.float64)  # (2, S, S): per mode, in C
        self.start_counts = np.asarray(start_counts, dtype=np.float64)            # (2, S)
        self.emission_weight, self.backoff, self.key_change = float(emission_weight), float(backoff), float(key_change)
        shapes = ((2, N_STATES, N_POS, 12), (len(Q), N_POS, 12), (2, N_STATES, N_STATES), (2, N_STATES))
        for arr, shape in zip((self.key_counts, self.interval_counts, self.transition_counts, self.start_counts),
                              shapes):
            if arr.shape != shape or not np.all(np.isfinite(arr)) or (arr < 0).any():
                raise SpemusicError("harmony tables: wrong shape or values (a file from elsewhere?)")
        if not (self.emission_weight > 0 and self.backoff > 0 and 0 <= self.key_change < 1):
            raise SpemusicError("harmony tables: emission weight, backoff or key change out of range")
        # the quality's melody above its root, put on each chord of C: the prior of a chord's melody
        rel = (self.interval_counts + 1) / (self.interval_counts + 1).sum(2, keepdims=True)
        prior = np.full((N_STATES, N_POS, 12), 1 / 12)
        for c in range(N_STATES - 1):
            root, q = divmod(c, len(Q))
            prior[c] = np.roll(rel[q], root, axis=1)
        k = self.key_counts
        self._log_melody = np.log((k + self.backoff * prior) / (k.sum(3, keepdims=True) + self.backoff))
        smooth = 0.1  # (a rare progression stays possible)
        t = self.transition_counts + smooth
        self._transition = t / t.sum(2, keepdims=True)
        s = self.start_counts + smooth
        self._start = s / s.sum(1, keepdims=True)

    @classmethod
    def fit(cls, pieces: list[BarData], key_rounds: int = 2, **settings) -> Harmonizer:
        """Count the tables over bars with chords; each song's key from its melody first, then
        `key_rounds` times the key in which its chords and melody are likeliest."""
        data = [(_positions(p), np.asarray(p.chords, dtype=np.int64)) for p in pieces]
        keys = [melody_key(p.melody) for p in pieces]
        for rnd in range(key_rounds + 1):
            counts = [np.zeros((2, N_STATES, N_POS, 12)), np.zeros((len(Q), N_POS, 12)),
                      np.zeros((2, N_STATES, N_STATES)), np.zeros((2, N_STATES))]
            for (metric, chords), (tonic, mode) in zip(data, keys):
                _count(counts, metric, chords, tonic, mode)
            h = cls(*counts, **settings)
            if rnd < key_rounds:
                keys = [h._likeliest_key(metric, chords) for metric, chords in data]
        return h

    def _likeliest_key(self, metric: np.ndarray, chords: np.ndarray) -> tuple[int, int]:
        """The (tonic, mode) in which a song's own chords and melody are likeliest."""
        best = None
        for mode in (0, 1):
            for tonic in range(12):
                c = _rotation(-tonic)[chords]
                ll = (np.log(self._start[mode, c[0]]) + np.log(self._transition[mode, c[:-1], c[1:]]).sum()
                      + np.einsum("tpk,tpk->", np.roll(metric, -tonic, axis=2), self._log_melody[mode, c]))
                if best is None or ll > best[0]:
                    best = (ll, tonic, mode)
        return best[1], best[2]

    def posterior(self, melody) -> np.ndarray:
        """(bars, N_STATES): the probability of each chord in each bar, given the whole melody
        (forward-backward over every key and its chords; N never, as an accompaniment plays chords
        in bars without melody too, where POP909 marks N on the silence before a song)."""
        metric = _positions(melody)
        n = len(metric)
        if not n:
            return np.zeros((0, N_STATES))
        modes = np.repeat([0, 1], 12)  # key i: tonic i % 12, mode i // 12
        em = self.emission_weight * np.stack([np.einsum("tpk,spk->ts", np.roll(metric, -(i % 12), axis=2),
                                                        self._log_melody[modes[i]]) for i in range(24)])
        em[:, :, NONE] = -np.inf
        e = np.exp(em - em.max((0, 2), keepdims=True)).transpose(1, 0, 2)  # (bars, keys, chords in C)
        trans, start, eps = self._transition[modes], self._start[modes] / 24, self.key_change
        fw, bw = np.empty_like(e), np.ones_like(e)
        a = start * e[0]
        fw[0] = a / a.sum()
        for t in range(1, n):  # the key stays, or moves (with a new first chord)
            a = ((1 - eps) * np.matmul(fw[t - 1][:, None], trans)[:, 0] + eps * start) * e[t]
            fw[t] = a / a.sum()
        for t in range(n - 2, -1, -1):
            nxt = e[t + 1] * bw[t + 1]
            b = (1 - eps) * np.matmul(trans, nxt[:, :, None])[:, :, 0] + eps * (start * nxt).sum()
            bw[t] = b / b.sum()
        post = fw * bw
        out = np.zeros((n, N_STATES))
        for i in range(24):  # back from C to each key's own chords
            out[:, _rotation(i % 12)] += post[:, i]
        return out / out.sum(1, keepdims=True)

    def chart(self, melody) -> list[str]:
        """The likeliest chord of each bar of a melody: a BarData, its (bars, N_POS, 12) positions,
        or a (bars, 12) histogram of beats per pitch class (read as if on the downbeats)."""
        return [CHORD_NAMES[c] for c in self.posterior(melody).argmax(1)]

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "qualities": list(Q), "positions": list(POSITIONS),
                "emission_weight": self.emission_weight, "backoff": self.backoff, "key_change": self.key_change,
                "key_counts": np.round(self.key_counts, 1).tolist(),
                "interval_counts": np.round(self.interval_counts, 1).tolist(),
                "transition_counts": self.transition_counts.astype(np.int64).tolist(),  # (whole counts)
                "start_counts": self.start_counts.astype(np.int64).tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> Harmonizer:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise SpemusicError("not a spemusic harmony file")
        if d.get("version") != VERSION:
            raise SpemusicError(f"a version-{d.get('version', 1)} harmony file; this spemusic reads version "
                                f"{VERSION} (refit it: python -m spemusic.training.fit_harmony CACHE OUT.json)")
        if d.get("qualities") != list(Q) or d.get("positions") != list(POSITIONS):
            raise SpemusicError("a harmony file for other chord qualities or melody positions")
        try:
            return cls(d["key_counts"], d["interval_counts"], d["transition_counts"], d["start_counts"],
                       d["emission_weight"], d["backoff"], d["key_change"])
        except (KeyError, TypeError, ValueError) as e:
            raise SpemusicError(f"harmony file: {e!r}") from None

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), separators=(",", ":")))

    @classmethod
    def load(cls, path: Path) -> Harmonizer:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SpemusicError(f"{path}: cannot read the harmony tables ({e})") from None
        except SpemusicError as e:
            raise SpemusicError(f"{path}: {e}") from None


def _count(counts: list[np.ndarray], metric: np.ndarray, chords: np.ndarray, tonic: int, mode: int) -> None:
    """Add one song (its melody positions and bar chords, in its key) to the tables."""
    key, intervals, transitions, starts = counts
    in_c = _rotation(-tonic)[chords]
    np.add.at(key[mode], in_c, np.roll(metric, -tonic, axis=2))
    for bar in np.nonzero(chords != NONE)[0]:
        root, q = divmod(int(chords[bar]), len(Q))
        intervals[q] += np.roll(metric[bar], -root, axis=1)
    if len(in_c):
        starts[mode, in_c[0]] += 1
    np.add.at(transitions[mode], (in_c[:-1], in_c[1:]), 1)


@functools.lru_cache(maxsize=4)
def _harmonizer(path: Path) -> Harmonizer:
    return Harmonizer.load(path)


def chart_melody(model, melody_ids, tokenizer) -> list[str] | None:
    """One chord per bar of a melody (its tokens), charted by the harmonizer shipped beside the
    model's weights (`model.harmony_file`, set by load_model); None when it has none."""
    path = getattr(model, "harmony_file", None)
    return None if path is None else _harmonizer(path).chart(bars_of(melody_ids, tokenizer))


def melody_chords(model, melody_ids, tokenizer, harmonize: bool = True) -> list[str | None] | None:
    """The chords `accompany` plays under a melody (its tokens), one per bar: the harmonizer's
    chart (`chart_melody`); or, not `harmonize`, None from the melody's first bar on (the model
    names each bar's chord after hearing its melody) and the chart before it: bars that precede
    the melody tell the model nothing of its key, and it holds the key it chose there. None: the
    model names every chord (it ships no harmonizer, or the melody opens the piece)."""
    chart = chart_melody(model, melody_ids, tokenizer)
    if chart is None or harmonize:
        return chart
    ids = np.asarray(melody_ids)
    notes = np.flatnonzero(ids == tokenizer.part_id("melody"))
    if not len(notes):
        return chart
    first = int(np.count_nonzero(ids[: notes[0]] == tokenizer.bar_id)) - 1  # the melody's first bar
    return list(chart[:first]) + [None] * (len(chart) - first) if first > 0 else None


def _triad(index: int) -> tuple[int, str]:
    root, q = divmod(index, len(Q))
    return root, TRIAD[Q[q]]


def accuracy(harmonizer: Harmonizer, pieces: list[BarData], triad: bool = False) -> float:
    """Share of the bars with a chord whose charted chord is the one covering most of the bar (with
    `triad`: has its root and its major or minor third, TRIAD)."""
    return _scores(harmonizer, pieces)[int(triad)]


def _scores(harmonizer: Harmonizer, pieces: list[BarData]) -> tuple[float, float]:
    """(exact, triad-level) bar accuracy."""
    exact = triad = total = 0
    for piece in pieces:
        chart = harmonizer.posterior(piece).argmax(1)
        for got, chord in zip(chart.tolist(), piece.chords.tolist()):
            if chord != NONE:
                total += 1
                exact += got == chord
                triad += _triad(got) == _triad(chord)
    return exact / max(total, 1), triad / max(total, 1)

