"""Repeat marks: each sweep of a bar says, before its notes, which bar it repeats.

Pop repeats itself at 4 and 8 bars: in POP909's train split 25% of the bars with a melody play
the melody of the bar 4 or 8 before them again (Jaccard of their (position, pitch) sets at least
0.6), and 14% of the bars' other parts theirs (docs/design.md, "Repeat marks"). A model that writes notes one
at a time must open a repeat on its first note, with nothing but its own odds to say that this
bar is a repeat; once begun, a repeat is easy to hold (the echo head copies it), but a sampled
piece seldom begins one. With a mark the choice is made once, up front, as the songs make it,
and the notes after it are written knowing it: ``Repeat_8`` before a melody says "this melody is
the one of 8 bars ago". The model's echo (spemusic.nn.recall) reads the mark in force.

Layout (``TokenizerConfig.repeats``, with melody_first): ``Bar [TimeSig] [Tempo] Repeat_m``, the
melody's onsets, ``Repeat_a``, the other parts' onsets (chords included). Every bar has both marks,
``Repeat_0`` where its sweep repeats no bar (or is empty). The marks are read off the notes: a mark
is the lag among REPEAT_LAGS whose bar is most like this one, if at least REPEAT_LIKENESS alike
(ties: the longer lag, the phrase), so the marks of a file follow from its notes and decoding
drops them. A mark names a bar of the piece whose sweep had notes (the grammar allows no
other), and in a training window one the window holds (`unseen_to_none`).

Copy marks (``TokenizerConfig.copies``): ``Repeat_copy1`` … ``Repeat_copy8`` mark a sweep whose
tokens are exactly those of the same sweep that many bars back, velocities aside (`mark_copies`;
in POP909's train split 14% of the melody's sweeps with notes, 4% of the other parts'). A
Repeat mark says "like that bar"; a copy mark says "that bar again", and when the model writes
one the sampler writes the copy (spemusic.tokens.grammar, `follow_copy`): a repeat is then one
choice, not forty tokens each drawn at its own odds. The velocities stay the model's.
"""

from __future__ import annotations

import numpy as np

from .vocabulary import BAR, EOS, REPEAT, REPEAT_LAGS, VELOCITY

# how alike two sweeps must be (Jaccard of their sets of notes) for the later to be marked a repeat
REPEAT_LIKENESS = 0.6


def repeat_lags(bar: np.ndarray, sweep: np.ndarray, item: np.ndarray, n_bars: int) -> np.ndarray:
    """(n_bars, 2) the lag each bar's sweep (0: the melody, 1: the other parts) repeats, 0 for none.
    `bar`, `sweep`, `item` (n,): each note's (or chord's) bar, sweep and what it is at its place
    in the bar (any int64 key: position, program, pitch)."""
    sets: list[list[frozenset]] = [[frozenset(), frozenset()] for _ in range(n_bars)]
    order = np.lexsort((sweep, bar))
    b, s, key = bar[order], sweep[order], item[order]
    cuts = np.flatnonzero(np.diff(b * 2 + s)) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(b)]):
        if hi > lo:
            sets[int(b[lo])][int(s[lo])] = frozenset(key[lo:hi].tolist())
    lags = np.zeros((n_bars, 2), dtype=np.int64)
    for i in range(n_bars):
        for k in (0, 1):
            mine = sets[i][k]
            alike = {lag: len(mine & sets[i - lag][k]) / len(mine | sets[i - lag][k])
                     for lag in REPEAT_LAGS if 0 < lag <= i and mine}
            best = max(alike, key=lambda lag: (alike[lag], lag), default=0)  # ties: the longer lag
            if best and alike[best] >= REPEAT_LIKENESS:
                lags[i, k] = best
    return lags


def unseen_to_none(ids: np.ndarray, tok) -> np.ndarray:
    """`ids` (a training window) with each mark that names a bar before the window's first Bar
    made ``Repeat_0``: a mark whose bar the model cannot see would teach it marks without copies
    (in windows of 2,048 tokens, about 20 bars, that would be a third of the marks 8 back)."""
    lo, hi = tok.range("Repeat")
    marks = np.flatnonzero((ids >= lo) & (ids < hi))
    if not len(marks):
        return ids
    bar = np.cumsum(ids == tok.bar_id)[marks] - 1  # the mark's bar, counted from the window's first
    unseen = tok.mark_lags[ids[marks] - lo] > bar
    out = ids.copy()
    out[marks[unseen]] = lo
    return out


def mark_ids(tok, lags: np.ndarray) -> np.ndarray:
    """The Repeat token ids of `lags` (any shape)."""
    return tok._repeat_first + np.searchsorted(np.array(REPEAT_LAGS), lags)


def mark_copies(ids: np.ndarray, tok) -> None:
    """Make each mark (in place) whose sweep has exactly the tokens of the same sweep 1, 2, 4 or 8
    bars back, velocities aside, the copy mark of that lag (the longest, as for Repeat marks)."""
    kinds = tok.kinds[ids]
    marks = np.flatnonzero(kinds == REPEAT)
    bounds = np.r_[np.flatnonzero(np.isin(kinds, (REPEAT, BAR, EOS))), len(ids)]
    ends = bounds[np.searchsorted(bounds, marks, side="right")]  # each sweep ends at the next mark, Bar or EOS
    bar = np.cumsum(kinds == BAR)[marks]
    sweep = np.r_[0, (bar[1:] == bar[:-1]).astype(np.int64)]  # a bar's second mark opens its other parts
    kept = (kinds != VELOCITY).tolist()
    tokens = ids.tolist()
    content = {(b, s): tuple(t for t, k in zip(tokens[m + 1:e], kept[m + 1:e]) if k)
               for m, e, b, s in zip(marks.tolist(), ends.tolist(), bar.tolist(), sweep.tolist())}
    lags = REPEAT_LAGS[1:]
    for m, b, s in zip(marks.tolist(), bar.tolist(), sweep.tolist()):
        mine = content[b, s]
        lag = next((lag for lag in reversed(lags) if mine and content.get((b - lag, s)) == mine), 0)
        if lag:
            ids[m] = tok._copy_first + lags.index(lag)


__all__ = ["REPEAT_LIKENESS", "mark_copies", "mark_ids", "repeat_lags", "unseen_to_none"]
