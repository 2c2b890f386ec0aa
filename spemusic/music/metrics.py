"""Music metrics on the token grid (MusDr-style): pitch-class entropy over 1 and 4 bars (H1, H4),
grooving-pattern similarity (GS), note density, polyphony, pitch range, and the style
similarity of a continuation to its source (cosine of histograms, per quarter); and what a
listener notices first: the meter (share of 4/4 bars), holes (time with no note sounding),
beats with an onset, key clarity, self-repetition, and whether bars follow their chords."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..tokens.grammar import REMIGrammar
from ..tokens.tokenizer import REMITokenizer


@dataclass
class NoteGrid:
    bar: np.ndarray        # bar index of each note
    pos: np.ndarray        # onset in grid steps from the bar line
    onset: np.ndarray      # onset in grid steps from the start
    pitch: np.ndarray
    drum: np.ndarray       # bool
    dur: np.ndarray        # duration in grid steps (0 for drums)
    n_bars: int
    bar_len: np.ndarray    # steps per bar
    chord_step: np.ndarray = None   # steps from the start of each Chord token ...
    chord_name: tuple = ()          # ... and its name ("A:min", "N")
    res: int = 12
    prog: np.ndarray = None         # Program token of each note (its part, with parts)
    vel: np.ndarray = None          # MIDI velocity of each note (its bin's)

    @property
    def bar_start(self) -> np.ndarray:
        return np.concatenate(([0], np.cumsum(self.bar_len)[:-1])).astype(np.int64)


def note_grid(ids, tok: REMITokenizer) -> NoteGrid:
    """The notes of a token sequence on the tokenizer's grid."""
    ts_lo, ts_hi = tok.range("TimeSig")
    pos_lo, pos_hi = tok.range("Position")
    prog_lo, prog_hi = tok.range("Program")
    pitch_lo, pitch_hi = tok.range("Pitch")
    dur_lo, dur_hi = tok.range("Duration")
    res = tok.config.beat_resolution
    bar_steps = REMIGrammar(tok).bar_steps
    chord_lo, chord_hi = tok.range("Chord") if tok.config.chords else (0, 0)
    rows, bar_lens, chords = [], [], []
    vel_lo, vel_hi = tok.range("Velocity")
    bar, start, cur_len, pos, drum, prog = -1, 0, 4 * res, 0, False, -1
    for t in map(int, ids):
        if t == tok.bar_id:
            if bar >= 0:
                start += cur_len
            bar += 1
            bar_lens.append(cur_len)
        elif ts_lo <= t < ts_hi:
            cur_len = bar_steps[t]
            if bar_lens:
                bar_lens[-1] = cur_len
        elif pos_lo <= t < pos_hi:
            pos = t - pos_lo
        elif prog_lo <= t < prog_hi:
            drum, prog = t == tok.drum_program_id, t
        elif pitch_lo <= t < pitch_hi:
            rows.append([bar, pos, start + pos, t - pitch_lo, int(drum), 0, prog, 0])
        elif vel_lo <= t < vel_hi and rows:
            rows[-1][7] = int(tok.velocity_values[t - vel_lo])
        elif dur_lo <= t < dur_hi and rows:
            rows[-1][5] = int(tok.duration_steps[t - dur_lo])
        elif chord_lo <= t < chord_hi:
            chords.append((start + pos, tok.vocab[t].split("_", 1)[1]))
    a = np.array(rows, dtype=np.int64).reshape(-1, 8)
    return NoteGrid(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4].astype(bool), a[:, 5], max(bar + 1, 0),
                    np.array(bar_lens, dtype=np.int64), np.array([c[0] for c in chords], dtype=np.int64),
                    tuple(c[1] for c in chords), res, a[:, 6], a[:, 7])


def four_four_share(g: NoteGrid) -> float:
    """Share of bars four beats long (4/4)."""
    return float(np.mean(g.bar_len == 4 * g.res)) if g.n_bars else float("nan")


def sounding(g: NoteGrid) -> np.ndarray:
    """Per grid step from the first bar line to the end of the last bar: is any note sounding
    (drum hits count one step)."""
    total = int(g.bar_len.sum())
    on = np.zeros(total + 1, dtype=np.int64)
    end = np.minimum(g.onset + np.maximum(np.where(g.drum, 1, g.dur), 1), total)
    np.add.at(on, np.minimum(g.onset, total), 1)
    np.add.at(on, end, -1)
    return np.cumsum(on)[:total] > 0


def silence(g: NoteGrid) -> tuple[float, float]:
    """(share of the time with no note sounding, the part of it inside bars without any onset),
    from the first onset to the end of the last note: rests the model chose as whole bars,
    against holes inside bars left by short notes or late onsets."""
    if not len(g.onset):
        return float("nan"), float("nan")
    s = sounding(g)
    lo, hi = int(g.onset.min()), int(min((g.onset + np.maximum(g.dur, 1)).max(), len(s)))
    span = np.arange(lo, hi)
    silent = ~s[lo:hi]
    bar_of = np.searchsorted(g.bar_start, span, side="right") - 1
    empty_bar = ~np.isin(bar_of, np.unique(g.bar))
    return float(silent.mean()), float((silent & empty_bar).mean())


def beats_with_onset(g: NoteGrid) -> float:
    """Share of the beats (of every bar from the first bar with a note to the last) holding an onset."""
    if not len(g.onset):
        return float("nan")
    first, last = int(g.bar.min()), int(g.bar.max())
    starts, lens = g.bar_start[first:last + 1], g.bar_len[first:last + 1]
    beats = np.concatenate([s + np.arange(0, L, g.res) for s, L in zip(starts, lens)])
    hit = np.zeros(len(beats), dtype=bool)
    idx = np.searchsorted(beats, g.onset, side="right") - 1
    hit[idx[idx >= 0]] = True
    return float(hit.mean())


# Krumhansl-Kessler key profiles (C major, C minor)
KK_MAJOR = np.array([6.35, 2.23, 3.48, 2.33, 4.38, 4.09, 2.52, 5.19, 2.39, 3.66, 2.29, 2.88])
KK_MINOR = np.array([6.33, 2.68, 3.52, 5.38, 2.60, 3.53, 2.54, 4.75, 3.98, 2.69, 3.34, 3.17])


def pitch_class_histogram(g: NoteGrid, sel: np.ndarray | None = None) -> np.ndarray:
    """Duration-weighted pitch-class histogram of the pitched notes (of `sel`)."""
    sel = ~g.drum if sel is None else sel & ~g.drum
    return np.bincount(g.pitch[sel] % 12, weights=np.maximum(g.dur[sel], 1), minlength=12).astype(float)


def melody_clashes(g: NoteGrid, melody: np.ndarray, accompaniment: np.ndarray | None = None) -> float:
    """Share of the melody's sounding time (grid steps, duration-weighted) in which a note of the
    other parts sounds a semitone (or a major seventh, or a minor ninth) away from it: the wrong
    notes a listener hears between a tune and its accompaniment. NaN without melody.
    `melody`, `accompaniment`: masks of the notes (default: every pitched note not of the melody)."""
    total = int(g.bar_len.sum())
    if not melody.any() or total == 0:
        return float("nan")
    # per step, the pitch classes the accompaniment sounds (12 bits)
    acc = (~melody if accompaniment is None else accompaniment) & ~g.drum
    classes = np.zeros((total + 1, 12), dtype=np.int64)
    ends = np.minimum(g.onset[acc] + np.maximum(g.dur[acc], 1), total)
    np.add.at(classes, (np.minimum(g.onset[acc], total), g.pitch[acc] % 12), 1)
    np.add.at(classes, (ends, g.pitch[acc] % 12), -1)
    sounding_classes = np.cumsum(classes, axis=0)[:total] > 0
    # per step and pitch class: does the accompaniment sound a semitone above or below it; summed
    # over the steps before each one, so that a note's clashing steps are one difference
    near = sounding_classes[:, np.r_[1:12, 0]] | sounding_classes[:, np.r_[11, 0:11]]
    before = np.r_[np.zeros((1, 12), np.int64), np.cumsum(near, axis=0)]
    on = np.minimum(g.onset[melody], total)
    end = np.minimum(g.onset[melody] + np.maximum(g.dur[melody], 1), total)
    pc = g.pitch[melody] % 12
    steps = int((end - on).sum())
    return float((before[end, pc] - before[on, pc]).sum()) / steps if steps else float("nan")


MAJOR_SCALE = np.array([0, 2, 4, 5, 7, 9, 11])


def out_of_key(g: NoteGrid, sel: np.ndarray) -> float:
    """The share of the time of the notes of `sel` (duration-weighted) outside the scale of the
    piece's key: its best Krumhansl-Kessler profile, a minor key read on its relative major's
    (natural minor) scale. The songs' melodies: 0.5%; a note outside the key is most often heard
    as a wrong one. NaN without such notes or without a key."""
    h = pitch_class_histogram(g)
    weight = np.maximum(g.dur[sel & ~g.drum], 1)
    if h.sum() == 0 or np.all(h == h[0]) or not weight.sum():
        return float("nan")
    fits = [(np.corrcoef(h, np.roll(p, k))[0, 1], k + 3 * minor) for minor, p in enumerate((KK_MAJOR, KK_MINOR))
            for k in range(12)]
    tonic = max(fits)[1] % 12  # (a minor key's relative major: its tonic 3 semitones up)
    outside = ~np.isin(g.pitch[sel & ~g.drum] % 12, (tonic + MAJOR_SCALE) % 12)
    return float((weight * outside).sum() / weight.sum())


def key_clarity(g: NoteGrid) -> float:
    """Largest correlation of the piece's pitch-class histogram with the 24 Krumhansl-Kessler key
    profiles (1: unambiguous key)."""
    h = pitch_class_histogram(g)
    if h.sum() == 0 or np.all(h == h[0]):
        return float("nan")
    profiles = [np.roll(p, k) for p in (KK_MAJOR, KK_MINOR) for k in range(12)]
    return float(max(np.corrcoef(h, p)[0, 1] for p in profiles))


def bar_sets(g: NoteGrid) -> list[set]:
    """Each bar's set of (pitch, 16th from the bar line) of its pitched notes."""
    sixteenth = max(g.res // 4, 1)
    sets = [set() for _ in range(g.n_bars)]
    pitched = ~g.drum
    for b, p, q in zip(g.bar[pitched].tolist(), g.pitch[pitched].tolist(), (g.pos[pitched] // sixteenth).tolist()):
        sets[b].add((p, q))
    return sets


def best_earlier_bars(g: NoteGrid, window: int = 16) -> list[tuple[int, int, float]]:
    """For every bar with notes after the first: (bar, the earlier bar among the `window` before it
    whose (pitch, 16th) set overlaps it most (-1 if none has notes), that Jaccard overlap)."""
    sets = bar_sets(g)
    rows = []
    for b in range(1, g.n_bars):
        if not sets[b]:
            continue
        best, best_a = 0.0, -1
        for a in range(max(0, b - window), b):
            if sets[a]:
                j = len(sets[a] & sets[b]) / len(sets[a] | sets[b])
                if j > best or best_a < 0:
                    best, best_a = j, a
        rows.append((b, best_a, best))
    return rows


def repetition(g: NoteGrid, window: int = 16) -> float:
    """Mean over bars with notes of the best Jaccard overlap of the bar's (pitch, 16th) set with
    each of the `window` bars before it: pop repeats itself, bar for bar."""
    scores = [j for _, _, j in best_earlier_bars(g, window)]
    return float(np.mean(scores)) if scores else float("nan")


def chords_at_bar_lines(g: NoteGrid) -> list[str | None]:
    """The chord in force at each bar line (None: no chord token came yet)."""
    out = []
    for s in g.bar_start.tolist():
        before = np.flatnonzero(g.chord_step <= s)
        out.append(g.chord_name[before[-1]] if len(before) else None)
    return out


def bar_chords(g: NoteGrid) -> list[str | None]:
    """The chord in force over each whole bar (None where the chord changes inside the bar, or no
    chord token came yet)."""
    steps = g.chord_step
    return [None if np.any((steps > s) & (steps < s + L)) else name
            for name, s, L in zip(chords_at_bar_lines(g), g.bar_start.tolist(), g.bar_len.tolist())]


def chord_match(g: NoteGrid, asked: list[str | None] | None = None, notes: np.ndarray | None = None) -> tuple[int, int]:
    """(bars whose asked chord is the best template match of their duration-weighted pitch-class
    content, bars counted). `asked`: one chord name per bar (default: the chord tokens' own,
    bar_chords); bars asked N or None, or without pitched notes, are not counted. `notes`: a
    mask of the notes that count (an accompaniment's alone, say)."""
    from ..tokens.chords import best_chord

    asked = bar_chords(g) if asked is None else asked
    hits = counted = 0
    for b, name in enumerate(asked[: g.n_bars]):
        if name is None or name == "N":
            continue
        sel = (g.bar == b) if notes is None else (g.bar == b) & notes
        best = best_chord(pitch_class_histogram(g, sel))
        if best is None:
            continue
        counted += 1
        hits += best == name
    return hits, counted


def pitch_class_entropy(g: NoteGrid, window_bars: int) -> float:
    """Mean over windows of `window_bars` bars of the entropy (bits) of the pitch-class histogram
    of pitched notes (MusDr H1 / H4). Windows without pitched notes are skipped."""
    pitched = ~g.drum
    values = []
    for w0 in range(0, max(g.n_bars, 1), window_bars):
        sel = pitched & (g.bar >= w0) & (g.bar < w0 + window_bars)
        if not sel.any():
            continue
        hist = np.bincount(g.pitch[sel] % 12, minlength=12).astype(float)
        p = hist[hist > 0] / hist.sum()
        values.append(float(-(p * np.log2(p)).sum()))
    return float(np.mean(values)) if values else float("nan")


def grooving_similarity(g: NoteGrid) -> float:
    """MusDr GS: mean over pairs of non-empty bars of 1 - (XOR of their onset-position patterns) / Q."""
    if g.n_bars < 2 or len(g.bar) == 0:
        return float("nan")
    q = int(max(g.bar_len.max() if len(g.bar_len) else 48, g.pos.max() + 1))
    patterns = np.zeros((g.n_bars, q), dtype=bool)
    patterns[g.bar, g.pos] = True
    patterns = patterns[patterns.any(1)]
    if len(patterns) < 2:
        return float("nan")
    p = patterns.astype(np.int32)
    xor = p.sum(1)[:, None] + p.sum(1)[None, :] - 2 * p @ p.T
    iu = np.triu_indices(len(p), k=1)
    return float(np.mean(1 - xor[iu] / q))


def polyphony(g: NoteGrid) -> float:
    """Mean number of notes per distinct onset."""
    return float(len(g.onset) / len(np.unique(g.onset))) if len(g.onset) else float("nan")


def summary(ids, tok: REMITokenizer) -> dict:
    g = note_grid(ids, tok)
    pitched = g.pitch[~g.drum]
    silent, silent_empty_bars = silence(g)
    return {
        "H1": pitch_class_entropy(g, 1), "H4": pitch_class_entropy(g, 4), "GS": grooving_similarity(g),
        "notes_per_bar": float(len(g.pitch) / g.n_bars) if g.n_bars else float("nan"),
        "polyphony": polyphony(g),
        "pitch_range": float(pitched.max() - pitched.min()) if len(pitched) else float("nan"),
        "bars_4_4": four_four_share(g), "silence": silent, "silence_in_empty_bars": silent_empty_bars,
        "beats_with_onset": beats_with_onset(g), "key_clarity": key_clarity(g), "repetition": repetition(g),
    }


INTERVALS = {"unison": (0, 0), "steps": (1, 2), "thirds": (3, 4), "fourths_fifths": (5, 7), "leaps": (8, 127)}


def part_summary(ids, tok: REMITokenizer) -> dict:
    """The parts of a piece (tokenizers with parts): the share of bars with a melody note; how
    often a melody onset holds one note; the melody's range, notes per bar and the histogram of
    the steps of its top line (unison, steps, thirds, fourths and fifths, larger leaps); the bass
    (the lowest piano-part note at each of its onsets) moving by a fourth or a fifth, among its
    moves; the spread (standard deviation) of all the notes' velocities; and the song's form: the
    bar the melody enters (counted from 0; the piece's length without one), the share of bars from
    there on that have it, and the notes per bar of the first 4 bars (a song opens on an intro)."""
    g = note_grid(ids, tok)
    nan = float("nan")
    out = {"velocity_spread": float(np.std(g.vel)) if len(g.vel) else nan}
    melody = g.prog == tok.part_id("melody") if tok.config.parts else np.zeros(len(g.pitch), dtype=bool)
    piano = g.prog == tok.part_id("piano") if tok.config.parts else ~g.drum
    bars = max(g.n_bars, 1)
    out["melody_bars"] = float(len(np.unique(g.bar[melody])) / bars)
    out["melody_notes_per_bar"] = float(melody.sum() / bars)
    if melody.sum() >= 2:
        onsets, first, counts = np.unique(g.onset[melody], return_index=True, return_counts=True)
        top = np.array([g.pitch[melody][g.onset[melody] == o].max() for o in onsets])
        out["melody_mono"] = float(np.mean(counts == 1))
        out["melody_range"] = float(g.pitch[melody].max() - g.pitch[melody].min())
        steps = np.abs(np.diff(top))
        for name, (lo, hi) in INTERVALS.items():
            out[f"melody_{name}"] = float(np.mean((steps >= lo) & (steps <= hi))) if len(steps) else nan
    else:
        out.update({k: nan for k in ("melody_mono", "melody_range", *(f"melody_{n}" for n in INTERVALS))})
    if piano.sum() >= 2:
        onsets = np.unique(g.onset[piano])
        bass = np.array([g.pitch[piano][g.onset[piano] == o].min() for o in onsets])
        moves = np.abs(np.diff(bass))
        moves = moves[moves > 0] % 12
        out["bass_fourth_fifth"] = float(np.mean((moves == 5) | (moves == 7))) if len(moves) else nan
    else:
        out["bass_fourth_fifth"] = nan
    out["melody_on_top"] = melody_on_top(g, melody)
    out["melody_clashes"] = melody_clashes(g, melody, ~melody) if melody.any() else nan
    out["melody_out_of_key"] = out_of_key(g, melody)
    out["accompaniment_out_of_key"] = out_of_key(g, ~melody)
    entry = int(g.bar[melody].min()) if melody.any() else bars
    out["melody_entry"] = float(entry)
    out["melody_kept"] = float(len(np.unique(g.bar[melody])) / (bars - entry)) if melody.any() else nan
    out["opening_notes_per_bar"] = float(np.sum(g.bar < 4) / min(bars, 4))
    return out


def melody_on_top(g: NoteGrid, melody: np.ndarray) -> float:
    """Share of the melody's notes that sound above every note of the other parts sounding at
    their onset (among those with such a note): a tune heard over its accompaniment. NaN without."""
    other = ~melody & ~g.drum
    start, end = g.onset[other], g.onset[other] + np.maximum(g.dur[other], 1)
    above = []
    for onset, pitch in zip(g.onset[melody], g.pitch[melody]):
        under = g.pitch[other][(start <= onset) & (onset < end)]
        if len(under):
            above.append(pitch > under.max())
    return float(np.mean(above)) if above else float("nan")


def style_histogram(g: NoteGrid, sel: np.ndarray | None = None) -> np.ndarray:
    """Drums: onset position in the bar × drum pitch. Pitched notes: onset position × duration
    (in steps, clipped) and time-to-next-onset × pitch interval, concatenated."""
    sel = np.ones(len(g.pitch), dtype=bool) if sel is None else sel
    q = 96
    drum = sel & g.drum
    h_drum = np.zeros((q, 128))
    np.add.at(h_drum, (np.minimum(g.pos[drum], q - 1), g.pitch[drum]), 1)
    pitched = sel & ~g.drum
    h_dur = np.zeros((q, 97))
    np.add.at(h_dur, (np.minimum(g.pos[pitched], q - 1), np.minimum(g.dur[pitched], 96)), 1)
    on, pi = g.onset[pitched], g.pitch[pitched]
    order = np.lexsort((pi, on))
    on, pi = on[order], pi[order]
    h_int = np.zeros((49, 49))
    if len(on) > 1:
        dt = np.minimum(np.diff(on), 48)
        dp = np.clip(np.diff(pi), -24, 24) + 24
        np.add.at(h_int, (dt, dp), 1)
    return np.concatenate([h_drum.ravel(), h_dur.ravel(), h_int.ravel()])


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return float(a @ b / (na * nb)) if na and nb else float("nan")


def continuation_similarity(source_ids, continuation_ids, tok: REMITokenizer, prompt_bars: int,
                            reference_bars: int | None = None) -> list[float]:
    """Cosine similarity between the style histogram of the source piece (its first
    `reference_bars` bars: the prompt; None: all of it) and each quarter (by bars) of the part of
    `continuation_ids` after the first `prompt_bars` bars. (The whole source holds the piece's own
    next bars: measured against it, the real continuation is partly compared with itself.)"""
    g_src = note_grid(source_ids, tok)
    ref = style_histogram(g_src, None if reference_bars is None else g_src.bar < reference_bars)
    g = note_grid(continuation_ids, tok)
    new_bars = g.n_bars - prompt_bars
    if new_bars < 4:
        return [float("nan")] * 4
    edges = prompt_bars + np.linspace(0, new_bars, 5).round().astype(int)
    return [cosine(ref, style_histogram(g, (g.bar >= edges[i]) & (g.bar < edges[i + 1]))) for i in range(4)]


def collection_summary(paths: list[Path], tok: REMITokenizer) -> tuple[dict, list[str]]:
    """Mean of each metric over MIDI files (NaNs skipped); returns (means, skipped reasons)."""
    from ..errors import MidiError

    rows, skipped = [], []
    for p in paths:
        try:
            rows.append(summary(tok.encode(p), tok))
        except MidiError as e:
            skipped.append(str(e))
    if not rows:
        return {}, skipped
    keys = rows[0].keys()
    return {k: float(np.nanmean([r[k] for r in rows])) if any(np.isfinite(r[k]) for r in rows) else float("nan")
            for k in keys} | {"files": len(rows)}, skipped


# the backbone of a groove: kick and snare (General MIDI, and the Groove set's kit: 37 side stick,
# 40 snare rim)
KICKS, SNARES = (35, 36), (37, 38, 40)


def _in_16ths(g: NoteGrid, pitches) -> tuple[np.ndarray, np.ndarray]:
    """(bar, sixteenth of the bar) of the drum hits on `pitches` (onsets rounded to the 16th)."""
    sel = g.drum & np.isin(g.pitch, pitches)
    return g.bar[sel], np.rint(g.pos[sel] * 4 / g.res).astype(np.int64)


def backbeat_bars(g: NoteGrid) -> dict[int, bool]:
    """Per 4/4 bar with a note (its index): whether it has a snare on beat 2 and on beat 4 (to the 16th)."""
    bars, sixteenths = _in_16ths(g, SNARES)
    return {int(b): {4, 12} <= set(sixteenths[bars == b].tolist()) for b in np.unique(g.bar)
            if g.bar_len[b] == 4 * g.res}


def backbeat_share(g: NoteGrid) -> float:
    """The share of 4/4 bars with a note that have a snare on beat 2 and on beat 4 (to the 16th)."""
    bars = backbeat_bars(g)
    return float(np.mean(list(bars.values()))) if bars else float("nan")


def drum_onsets_per_bar(g: NoteGrid) -> float:
    """Distinct drum onsets (grid steps) per bar."""
    return float(len(np.unique(g.onset[g.drum])) / g.n_bars) if g.n_bars else float("nan")


def backbone_similarity(source_ids, continuation_ids, tok: REMITokenizer, prompt_bars: int) -> float:
    """How closely a continuation's kick and snare keep the prompt's places in the bar: the cosine
    of their (drum, sixteenth of the bar) histograms, the first `prompt_bars` bars of the source
    against the continuation's bars after them."""
    def histogram(g: NoteGrid, keep) -> np.ndarray:
        h = np.zeros((2, 64))
        for row, pitches in enumerate((KICKS, SNARES)):
            bars, sixteenths = _in_16ths(g, pitches)
            np.add.at(h[row], np.minimum(sixteenths[keep(bars)], 63), 1)
        return h.ravel()

    prompt = histogram(note_grid(source_ids, tok), lambda b: b < prompt_bars)
    return cosine(prompt, histogram(note_grid(continuation_ids, tok), lambda b: b >= prompt_bars))
