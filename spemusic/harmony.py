"""Harmonize a melody: one chord per bar, from the whole melody at once (a hidden Markov model).

`spemusic accompany` plays chords under a melody, and the Performer names them only from the bars
before: with the song's own chords forced its accompaniments match them in 0.83 of the bars and
leave the melody a semitone off them 8% of its time, but with the chords it names itself (while
it writes) 0.09 and 11% (real songs: 5%; docs/pop-piano-history.md). A chord chart drawn from the
whole melody, as a musician drafts one before playing, is the missing step.

The model is the classic one for melody harmonization: the chords are the hidden states, a
bar's melody notes are what each chord emits, and the Viterbi path is the most likely chart.
Both tables are relative, so every key is the same to it and it needs no key of its own:

- a chord's melody: for each quality, the share of melody time (in beats) at each interval
  above the chord's root;
- the progression: the next chord's root interval and quality, given the last chord's quality.

They are counts over a token cache's train split (bars with their melody notes and the chord
that covers most of each), with add-one smoothing; `python -m spemusic.harmony CACHE OUT.json`
writes them. The emission weight (nats per beat of melody against the progression's) is chosen
on the valid split.
"""

from __future__ import annotations

import argparse
import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .chords import CHORD_NAMES, NO_CHORD, QUALITIES
from .errors import SpemusicError

Q = tuple(QUALITIES)        # qualities, in vocabulary order
N_STATES = len(CHORD_NAMES)  # 12 roots x qualities, then N
FORMAT = "spemusic-harmony"


@dataclass
class BarData:
    """Per bar of a piece: the melody's time at each pitch class (beats), and the chord that covers
    most of the bar (an index into CHORD_NAMES)."""
    melody: np.ndarray   # (bars, 12)
    chords: np.ndarray   # (bars,)


def bars_of(ids, tokenizer) -> BarData:
    """The bars of a token sequence with chords (as written by a tokenizer with parts and chords)."""
    from .metrics import note_grid

    g = note_grid(ids, tokenizer)
    starts, ends = g.bar_start, g.bar_start + g.bar_len
    sel = g.prog == tokenizer.part_id("melody")
    bar, onset = g.bar[sel], g.onset[sel]
    melody = np.zeros((g.n_bars, 12))  # each note up to its bar's end
    np.add.at(melody, (bar, g.pitch[sel] % 12), (np.minimum(onset + np.maximum(g.dur[sel], 1), ends[bar]) - onset) / g.res)
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
    return BarData(melody, chords)


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


def _rotate_chord(index: int, shift: int) -> int:
    """A CHORD_NAMES index with its root moved by `shift` semitones (N stays N)."""
    if index == N_STATES - 1:
        return index
    root, q = divmod(index, len(Q))
    return ((root + shift) % 12) * len(Q) + q


class Harmonizer:
    """Chord tables in the key of C (see the module notes) and the Viterbi chart of a melody."""

    def __init__(self, interval_counts: np.ndarray, transition_counts: np.ndarray, start_counts: np.ndarray,
                 emission_weight: float = 1.0):
        self.interval_counts = np.asarray(interval_counts, dtype=np.float64)      # (Q, 12): melody over the root
        self.transition_counts = np.asarray(transition_counts, dtype=np.float64)  # (2, S, S): per mode, in C
        self.start_counts = np.asarray(start_counts, dtype=np.float64)            # (2, S)
        self.emission_weight = float(emission_weight)
        shapes = ((len(Q), 12), (2, N_STATES, N_STATES), (2, N_STATES))
        for arr, shape in zip((self.interval_counts, self.transition_counts, self.start_counts), shapes):
            if arr.shape != shape or not np.all(np.isfinite(arr)) or (arr < 0).any():
                raise SpemusicError("harmony tables: wrong shape or values (a file from elsewhere?)")
        self._log_interval = np.log((self.interval_counts + 1) / (self.interval_counts + 1).sum(1, keepdims=True))
        smooth = 0.1  # (a rare progression stays possible)
        self._log_transition = np.log((self.transition_counts + smooth) /
                                      (self.transition_counts + smooth).sum(2, keepdims=True))
        self._log_start = np.log((self.start_counts + smooth) / (self.start_counts + smooth).sum(1, keepdims=True))

    @classmethod
    def fit(cls, pieces: list[BarData]) -> Harmonizer:
        intervals = np.zeros((len(Q), 12))
        transitions = np.zeros((2, N_STATES, N_STATES))
        starts = np.zeros((2, N_STATES))
        for piece in pieces:
            tonic, mode = melody_key(piece.melody)
            chords = [_rotate_chord(c, -tonic) for c in piece.chords.tolist()]
            for hist, chord in zip(piece.melody, piece.chords.tolist()):
                if chord != N_STATES - 1:
                    root, q = divmod(chord, len(Q))
                    intervals[q] += np.roll(hist, -root)
            if chords:
                starts[mode, chords[0]] += 1
            for a, b in zip(chords[:-1], chords[1:]):
                transitions[mode, a, b] += 1
        return cls(intervals, transitions, starts)

    def emissions(self, melody: np.ndarray) -> np.ndarray:
        """(bars, N_STATES): log-likelihood of each bar's melody (beats per pitch class) under each
        chord, times the emission weight; N never (an accompaniment plays chords, in bars without
        melody too, where POP909 marks N on the silence before a song)."""
        nq = len(Q)
        out = np.empty((len(melody), N_STATES))
        for r in range(12):
            rel = np.roll(melody, -r, axis=1)  # the melody over root r
            out[:, r * nq:(r + 1) * nq] = rel @ self._log_interval.T
        out *= self.emission_weight
        out[:, -1] = -np.inf
        return out

    def chart(self, melody: np.ndarray) -> list[str]:
        """The most likely chord of each bar (Viterbi over the whole melody, in its key)."""
        melody = np.asarray(melody, dtype=np.float64)
        if not len(melody):
            return []
        tonic, mode = melody_key(melody)
        em = self.emissions(np.roll(melody, -tonic, axis=1))  # the melody in C
        trans = self._log_transition[mode]
        score = self._log_start[mode] + em[0]
        back = np.zeros((len(melody), N_STATES), dtype=np.int64)
        for t in range(1, len(melody)):
            cand = score[:, None] + trans
            back[t] = np.argmax(cand, axis=0)
            score = cand[back[t], np.arange(N_STATES)] + em[t]
        path = [int(np.argmax(score))]
        for t in range(len(melody) - 1, 0, -1):
            path.append(int(back[t, path[-1]]))
        return [CHORD_NAMES[_rotate_chord(c, tonic)] for c in reversed(path)]

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": 1, "qualities": list(Q), "emission_weight": self.emission_weight,
                "interval_counts": np.round(self.interval_counts, 2).tolist(),
                "transition_counts": self.transition_counts.astype(np.int64).tolist(),  # (whole counts)
                "start_counts": self.start_counts.astype(np.int64).tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> Harmonizer:
        if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("qualities") != list(Q):
            raise SpemusicError("not a spemusic harmony file (or one for other chord qualities)")
        try:
            return cls(d["interval_counts"], d["transition_counts"], d["start_counts"], d["emission_weight"])
        except (KeyError, TypeError, ValueError) as e:
            raise SpemusicError(f"harmony file: {e}") from None

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: Path) -> Harmonizer:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as e:
            raise SpemusicError(f"{path}: cannot read the harmony tables ({e})") from None


@functools.lru_cache(maxsize=4)
def _harmonizer(path: Path) -> Harmonizer:
    return Harmonizer.load(path)


def chart_melody(model, melody_ids, tokenizer) -> list[str] | None:
    """One chord per bar of a melody (its tokens), charted by the harmonizer shipped beside the
    model's weights (`model.harmony_file`, set by load_model); None when it has none."""
    path = getattr(model, "harmony_file", None)
    return None if path is None else _harmonizer(path).chart(bars_of(melody_ids, tokenizer).melody)


def accuracy(harmonizer: Harmonizer, pieces: list[BarData]) -> float:
    """Share of the bars with a chord whose charted chord is the one covering most of the bar."""
    none = CHORD_NAMES.index(NO_CHORD)
    hits = total = 0
    for piece in pieces:
        chart = harmonizer.chart(piece.melody)
        for name, chord in zip(chart, piece.chords.tolist()):
            if chord != none:
                total += 1
                hits += name == CHORD_NAMES[chord]
    return hits / max(total, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description="Fit the harmony tables on a token cache (parts and chords).")
    ap.add_argument("cache", type=Path)
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    from .data import TokenCache

    cache = TokenCache.load(args.cache)
    tok = cache.tokenizer
    if not (tok.config.parts and tok.config.chords):
        raise SystemExit(f"{args.cache}: a cache with parts and chords is needed")
    train = [bars_of(s, tok) for s in cache.sequences("train")]
    valid = [bars_of(s, tok) for s in cache.sequences("valid")]
    fitted = Harmonizer.fit(train)
    best = None
    for weight in (0.25, 0.5, 1.0, 2.0, 4.0):
        h = Harmonizer(fitted.interval_counts, fitted.transition_counts, fitted.start_counts, weight)
        acc = accuracy(h, valid)
        print(f"emission weight {weight}: valid bar accuracy {acc:.3f}")
        if best is None or acc > best[0]:
            best = (acc, h)
    best[1].save(args.out)
    print(f"wrote {args.out} (emission weight {best[1].emission_weight}, valid bar accuracy {best[0]:.3f})")


if __name__ == "__main__":
    main()
