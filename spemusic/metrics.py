"""Music metrics on the token grid (MusDr-style): pitch-class entropy over 1 and 4 bars (H1, H4),
grooving-pattern similarity (GS), note density, polyphony, pitch range, and the style
similarity of a continuation to its source (cosine of histograms, per quarter)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .grammar import REMIGrammar
from .tokenizer import REMITokenizer


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


def note_grid(ids, tok: REMITokenizer) -> NoteGrid:
    """The notes of a token sequence on the tokenizer's grid."""
    ts_lo, ts_hi = tok.range("TimeSig")
    pos_lo, pos_hi = tok.range("Position")
    prog_lo, prog_hi = tok.range("Program")
    pitch_lo, pitch_hi = tok.range("Pitch")
    dur_lo, dur_hi = tok.range("Duration")
    res = tok.config.beat_resolution
    bar_steps = REMIGrammar(tok).bar_steps
    rows, bar_lens = [], []
    bar, start, cur_len, pos, drum = -1, 0, 4 * res, 0, False
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
            drum = t == tok.drum_program_id
        elif pitch_lo <= t < pitch_hi:
            rows.append([bar, pos, start + pos, t - pitch_lo, int(drum), 0])
        elif dur_lo <= t < dur_hi and rows:
            rows[-1][5] = int(tok.duration_steps[t - dur_lo])
    a = np.array(rows, dtype=np.int64).reshape(-1, 6)
    return NoteGrid(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4].astype(bool), a[:, 5], max(bar + 1, 0),
                    np.array(bar_lens, dtype=np.int64))


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
    return {
        "H1": pitch_class_entropy(g, 1), "H4": pitch_class_entropy(g, 4), "GS": grooving_similarity(g),
        "notes_per_bar": float(len(g.pitch) / g.n_bars) if g.n_bars else float("nan"),
        "polyphony": polyphony(g),
        "pitch_range": float(pitched.max() - pitched.min()) if len(pitched) else float("nan"),
    }


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


def continuation_similarity(source_ids, continuation_ids, tok: REMITokenizer, prompt_bars: int) -> list[float]:
    """Cosine similarity between the source piece's style histogram and each quarter (by bars) of
    the part of `continuation_ids` after the first `prompt_bars` bars."""
    ref = style_histogram(note_grid(source_ids, tok))
    g = note_grid(continuation_ids, tok)
    new_bars = g.n_bars - prompt_bars
    if new_bars < 4:
        return [float("nan")] * 4
    edges = prompt_bars + np.linspace(0, new_bars, 5).round().astype(int)
    return [cosine(ref, style_histogram(g, (g.bar >= edges[i]) & (g.bar < edges[i + 1]))) for i in range(4)]


def collection_summary(paths: list[Path], tok: REMITokenizer) -> tuple[dict, list[str]]:
    """Mean of each metric over MIDI files (NaNs skipped); returns (means, skipped reasons)."""
    from .errors import MidiError

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
