"""Encoding: a MIDI file (read by :mod:`spemusic.tokens.file_policy`) to token ids of the vocabulary
(:mod:`spemusic.tokens.vocabulary`): quantisation to the grid, bars from the time-signature map or a
beat annotation, tempos, chords and the token layout, vectorised in numpy. The functions take the
tokenizer; REMITokenizer's methods call them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from spemusic.errors import MidiError
from spemusic.tokens.beats import BeatMap, Beats, TempoMap, read_beats
from spemusic.tokens.chords import read_chords
from spemusic.tokens.file_policy import MAX_BARS, Parsed, read_parsed
from spemusic.tokens.repeats import mark_copies, mark_ids, repeat_lags
from spemusic.tokens.vocabulary import DRUMS, PART_CODES

if TYPE_CHECKING:
    from spemusic.tokens.vocabulary import Vocabulary


def _round_div(a: np.ndarray, num: int, den: int) -> np.ndarray:
    """round(a * num / den), half up, exact in integers (a >= 0)."""
    return (a.astype(np.int64) * (2 * num) + den) // (2 * den)


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


def encode(tok: Vocabulary, midi, beats=None, chords=None) -> np.ndarray:
    """Token ids (int32) of a MIDI file: path, bytes, miditoolkit.MidiFile or symusic.Score.

    beats: a beat annotation (path or :class:`~spemusic.tokens.beats.Beats`): bars then start at its
    downbeats and onsets are placed between its beats. chords: a chord annotation (path or
    list of :class:`~spemusic.tokens.chords.ChordChange`), written as Chord tokens (needs a config
    with ``chords=True``)."""
    return encode_with_stats(tok, midi, beats, chords)[0]


def encode_with_stats(tok: Vocabulary, midi, beats=None, chords=None) -> tuple[np.ndarray, dict[str, Any]]:
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
    p = read_parsed(tok, midi)
    warnings = p.warnings
    beat_map = None
    if beats is not None:
        original_time = p.time
        p, beat_map = warp_to_beats(tok, p, beats if isinstance(beats, Beats) else read_beats(beats))
    chord_steps = None
    if chords is not None:
        if not tok.config.chords:
            raise ValueError("this tokenizer has no chord tokens (TokenizerConfig(chords=True))")
        changes = chords if isinstance(chords, list) else read_chords(chords)
        tempo = TempoMap(p.tpq, p.tempo_time, p.tempo_qpm) if beat_map is None else beat_map.tempo
        ticks = tempo.ticks(np.array([c.time for c in changes], dtype=np.float64))
        chord_steps = chord_steps_at(tok, p, ticks, [c.name for c in changes], beat_map)
    elif tok.config.chords and p.chord_marks:  # chord markers, as decode writes them
        ticks, names = zip(*sorted(p.chord_marks, key=lambda m: m[0]))
        chord_steps = chord_steps_at(tok, p, np.array(ticks, dtype=np.float64), names, None)
    ids, stats = encode_parsed(tok, p, chord_steps)
    if beat_map is not None:
        # each onset on the grid, back in the original file's time, against where it was
        res = tok.config.beat_resolution
        step = _round_div(p.time, res, p.tpq)
        orig_beats = beat_map.beat_of(np.maximum(original_time, 0))
        tempo = beat_map.tempo
        err_sec = np.abs(tempo.seconds(beat_map.tick_of(step / res)) - tempo.seconds(np.maximum(original_time, 0)))
        stats["max_onset_error_beats"] = float(np.abs(step / res - orig_beats).max())
        stats["max_onset_error_seconds"] = float(err_sec.max())
        stats["beat_bars"] = stats["bars"]
    stats["warnings"] = warnings
    return ids, stats


def encode_on_beats(tok: Vocabulary, midi, beats) -> tuple[np.ndarray, BeatMap]:
    """Token ids on a beat annotation (path or Beats), and the BeatMap that placed them (for
    callers that map bars back to the file's ticks, as `continue` does)."""
    p, beat_map = warp_to_beats(tok, read_parsed(tok, midi), beats if isinstance(beats, Beats) else read_beats(beats))
    return encode_parsed(tok, p)[0], beat_map


def warp_to_beats(tok: Vocabulary, p: Parsed, beats: Beats) -> tuple[Parsed, BeatMap]:
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
    W = tok.ticks_per_beat_out
    q = Parsed()
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


def chord_steps_at(tok: Vocabulary, p: Parsed, ticks: np.ndarray, names,
                   beat_map: BeatMap | None) -> tuple[np.ndarray, np.ndarray]:
    """(grid step, chord index) of chord changes at `ticks` of the original file, on the
    grid of p (warped to the beats when beat_map is given)."""
    idx = np.array([tok._chord_index[n] for n in names], dtype=np.int64)
    res = tok.config.beat_resolution
    steps = np.rint(beat_map.beat_of(ticks) * res) if beat_map is not None else np.rint(ticks * res / p.tpq)
    return np.maximum(steps, 0).astype(np.int64), idx


def bar_lines(tok: Vocabulary, p: Parsed, last_step: int, res: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Bar start steps and TS index per bar, from the time-signature map."""
    tpq = p.tpq
    segs: list[tuple[int, int]] = []
    if len(p.ts_time):
        order = np.argsort(p.ts_time, kind="stable")
        steps = _round_div(p.ts_time[order], res, tpq).tolist()
        nums = p.ts_num[order].tolist()
        dens = p.ts_den[order].tolist()
        for st, n, d in zip(steps, nums, dens):
            ti = tok.map_time_signature(n, d)
            if segs and segs[-1][0] == st:
                segs[-1] = (st, ti)  # several at one time: the last wins
            else:
                segs.append((st, ti))
    if not segs or segs[0][0] > 0:
        segs.insert(0, (0, tok._default_ts))
    segs = [s for i, s in enumerate(segs) if i == 0 or s[0] <= last_step]
    ts_len = tok.bar_lengths
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
                tk = tok._ts_by_len.get(rem)
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


def tempo_bins_at(tok: Vocabulary, p: Parsed, steps: np.ndarray) -> tuple[np.ndarray, int]:
    """The tempo bin in force at each grid step of `steps` (120 BPM before the first tempo), and
    how many of the file's tempos lie outside the vocabulary's range (clipped to it)."""
    cfg = tok.config
    if not len(p.tempo_time):
        return np.repeat(tok.tempo_bin([120.0]), len(steps)), 0
    torder = np.argsort(p.tempo_time, kind="stable")
    t_steps = np.concatenate(([-1], _round_div(np.maximum(p.tempo_time[torder], 0), cfg.beat_resolution, p.tpq)))
    qpm = p.tempo_qpm[torder]
    t_bins = np.concatenate((tok.tempo_bin([120.0]), tok.tempo_bin(qpm)))
    clipped = int(np.count_nonzero((qpm < cfg.tempo_min * 0.999) | (qpm > cfg.tempo_max * 1.001)))
    return t_bins[np.searchsorted(t_steps, steps, side="right") - 1], clipped


def _repeat_lags(note_bar, sweep, note_pos, prog, pitch, u_bar, u_sweep, u_pos, chord_at, nb: int) -> np.ndarray:
    """Each bar's Repeat marks (nb, 2), read off its notes: in the melody's sweep (position,
    pitch), in the other parts' (position, program, pitch) and (position, chord)."""
    key = (note_pos * 256 + np.where(sweep, prog, 0)) * 128 + pitch
    bar, swp = note_bar, sweep.astype(np.int64)
    if chord_at is not None:
        has = chord_at >= 0
        key = np.concatenate((key, (u_pos[has] * 256 + 255) * 128 + chord_at[has]))
        bar, swp = np.concatenate((bar, u_bar[has])), np.concatenate((swp, u_sweep[has]))
    return repeat_lags(bar, swp, key, nb)


def encode_parsed(tok: Vocabulary, p: Parsed, chord_steps=None) -> tuple[np.ndarray, dict[str, Any]]:
    cfg = tok.config
    res = cfg.beat_resolution
    tpq = p.tpq
    n_in = len(p.time)
    time = np.maximum(p.time, 0)
    on = _round_div(time, res, tpq)
    drum = p.prog == DRUMS
    if cfg.drum_grid:  # each drum hit on its nearest sixteenth or eighth-note triplet
        on[drum] = on[drum] // res * res + tok._drum_snap[on[drum] % res]
    err_num = np.abs(time * res - on * tpq)  # error in ticks * res
    moved_onsets = int(np.count_nonzero(err_num))
    max_err = float(err_num.max()) / res if n_in else 0.0
    dsteps = np.maximum(_round_div(np.maximum(p.dur, 0), res, tpq), 1)
    pitch = np.clip(p.pitch, 0, 127)
    prog = p.prog
    clipped_mask = (dsteps > tok.max_duration_steps) & ~drum

    vbin = tok._vel_to_bin[np.clip(p.vel, 0, 127)]
    dbin = tok._dur_to_bin[np.minimum(dsteps, tok.max_duration_steps)]
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
    bar_start, bar_ts, ts_moved = bar_lines(tok, p, last_step, res)
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
        b_tempo, tempos_clipped = tempo_bins_at(tok, p, bar_start)
        bar_tempo_flag = np.r_[True, b_tempo[1:] != b_tempo[:-1]]
        tempo_flag = np.zeros(nu, dtype=bool)
    else:
        u_tempo, tempos_clipped = tempo_bins_at(tok, p, u_step)
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
    if cfg.repeats:  # each sweep of each bar opens on its Repeat mark (spemusic.tokens.repeats)
        lags = _repeat_lags(note_bar, sweep, on - bar_start[note_bar], prog, pitch, u_bar, u_sweep, u_pos, chord_at, nb)
        item_bar = np.concatenate((item_bar, np.arange(nb), np.arange(nb)))
        item_sweep = np.concatenate((item_sweep, np.zeros(nb, np.int64), np.ones(nb, np.int64)))
        item_step = np.concatenate((item_step, np.full(2 * nb, -1, np.int64)))
        item_type = np.concatenate((item_type, np.zeros(2 * nb, np.int64)))
        item_rank = np.concatenate((item_rank, np.zeros(2 * nb, np.int64)))
        item_len = np.concatenate((item_len, np.ones(2 * nb, np.int64)))
    iorder = np.lexsort((item_rank, item_type, item_step, item_sweep, item_bar))
    offs_sorted = np.cumsum(item_len[iorder]) - item_len[iorder] + 1  # +1 for BOS
    offs = np.empty_like(offs_sorted)
    offs[iorder] = offs_sorted
    total = int(item_len.sum()) + 2
    out = np.empty(total, dtype=np.int32)
    out[0] = tok.bos_id
    out[-1] = tok.eos_id
    bo, uo, no = offs[:nb], offs[nb : nb + nu], offs[nb + nu : nb + nu + n]
    out[bo] = tok.bar_id
    out[bo[ts_flag] + 1] = tok._ts_first + bar_ts[ts_flag]
    if melody_first:
        out[bo[bar_tempo_flag] + 1 + ts_flag[bar_tempo_flag]] = tok._tempo_first + b_tempo[bar_tempo_flag]
    out[uo] = tok._pos_first + u_pos
    if chord_at is not None:
        out[uo[chord_flag] + 1] = tok._chord_first + chord_at[chord_flag]
    if not melody_first:
        out[uo[tempo_flag] + 1 + chord_flag[tempo_flag]] = tok._tempo_first + u_tempo[tempo_flag]
    out[no] = tok._prog_first + prog
    out[no + 1] = tok._pitch_first + pitch
    out[no + 2] = tok._vel_first + vbin
    nd = ~drum
    out[no[nd] + 3] = tok._dur_first + dbin[nd]
    if cfg.repeats:
        mo = offs[nb + nu + n:]
        out[mo] = mark_ids(tok, np.concatenate((lags[:, 0], lags[:, 1])))
        if cfg.copies:
            mark_copies(out, tok)

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
