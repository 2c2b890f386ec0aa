"""Decoding: token ids to notes, tempos, time signatures and chord markers, and those to a symusic
Score, a miditoolkit MidiFile or a MIDI file (one track per program and part; overlapping notes
trimmed or on layer tracks). It ignores tokens that do not fit the grammar. The functions take
the tokenizer; REMITokenizer's methods call them."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import numpy as np
import symusic

from spemusic.files import write_atomically
from spemusic.tokens.chords import CHORD_NAMES
from spemusic.tokens.vocabulary import (
    BAR,
    CHORD,
    DRUMS,
    DURATION,
    EOS,
    NO_CHORD_MARK,
    PART_OF_CODE,
    PITCH,
    POSITION,
    PROGRAM,
    TEMPO,
    TICKS_PER_STEP_OUT,
    TIMESIG,
    VELOCITY,
    TokenError,
    gm_names,
)

if TYPE_CHECKING:
    from spemusic.tokens.vocabulary import Vocabulary


MAX_MIDI_TICK = 2**28 - 1  # the largest MIDI variable-length quantity
MAX_MIDI_TRACKS = 2**16 - 1  # a MIDI header counts its tracks in 16 bits


def decode_events(tok: Vocabulary, ids):
    """Walk ids; return note arrays (step, duration steps, pitch, velocity, program code), tempos, TSs
    and chords, each a list of (step, index)."""
    kinds, vals = tok._kind_list, tok._value_list
    V = len(kinds)
    ts_len = tok.bar_lengths.tolist()
    cur_ts = tok._default_ts
    bar_len = ts_len[cur_ts]
    bar_start = 0
    started = False
    onset = 0
    prog = pitch = vel = -1
    notes: list[tuple[int, int, int, int, int]] = []  # (step, duration steps, pitch, velocity, program)
    tempos: list[tuple[int, int]] = []  # (step, bin)
    tss: list[tuple[int, int]] = []  # (step, ts index)
    chords: list[tuple[int, int]] = []  # (step, chord index)
    vel_vals = tok.velocity_values.tolist()
    dur_vals = tok.duration_steps.tolist()
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


def layers(step: np.ndarray, dur: np.ndarray, pitch: np.ndarray, prog: np.ndarray) -> np.ndarray:
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


def count_notes(tok: Vocabulary, ids) -> int:
    """Notes the tokens form, overlapping ones included (a Pitch without its Program, Velocity
    or Duration forms none)."""
    return len(decode_events(tok, ids)[0][0])


def decode_notes(tok: Vocabulary, ids, overlaps: str, stats: dict[str, int] | None = None):
    if overlaps not in ("trim", "layers"):
        raise ValueError(f"overlaps must be 'trim' or 'layers', not {overlaps!r}")
    notes, tempos, tss, chords = decode_events(tok, ids)
    if stats is not None:
        # every note has one Pitch token: the others are notes the decoder had to skip
        lo, hi = tok.range("Pitch")
        arr = np.asarray(ids).ravel()
        stats["notes"] = len(notes[0])
        stats["lost_notes"] = int(np.count_nonzero((arr >= lo) & (arr < hi))) - stats["notes"]
    if overlaps == "trim":
        notes = trim_overlaps(*notes)
    return notes, tempos, tss, chords


def tracks(tok: Vocabulary, step, dur, pitch, vel, prog):
    """Yield (name, program, is_drum, note indices) per output track: one per program and layer."""
    names = gm_names()
    layer = layers(step, dur, pitch, prog)
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
        program = 0 if drum else tok.part_programs[pc] if part else pc
        yield name, program, drum, order[bounds[t]:bounds[t + 1]]


def chord_mark(index: int) -> str:
    """Marker text of a chord (its vocabulary name; N.C. for no chord)."""
    name = CHORD_NAMES[index]
    return NO_CHORD_MARK if name == CHORD_NAMES[-1] else name


def tempo_mspq(tok: Vocabulary, b: int) -> int:
    return int(round(6e7 / float(tok.tempo_values[b])))


def decode_to_score(tok: Vocabulary, ids, overlaps: str = "trim") -> symusic.Score:
    """Decode ids to a symusic Score (ticks_per_quarter = beat_resolution * 40).

    overlaps="trim" (default): a note overlapping an earlier one of the same program and
    pitch ends it, one track per program (what MIDI players do anyway). "layers": every
    note keeps its duration, the overlapping ones on extra "layer" tracks (lossless:
    encode(decode(ids, overlaps="layers")) == ids)."""
    return decode_with_stats(tok, ids, overlaps)[0]


def decode_with_stats(tok: Vocabulary, ids, overlaps: str = "trim") -> tuple[symusic.Score, dict[str, int]]:
    """decode_to_score, plus what became of the notes: notes (formed by the tokens,
    overlapping ones included) and lost_notes (Pitch tokens that formed none: a Pitch
    without its Program, Velocity or Duration, or after EOS)."""
    stats: dict[str, int] = {}
    (step, dur, pitch, vel, prog), tempos, tss, chords = decode_notes(tok, ids, overlaps, stats)
    k = TICKS_PER_STEP_OUT
    last = max(int((step + dur).max(initial=0)), max((s for s, _ in tempos + tss + chords), default=0)) * k
    # a MIDI delta time has at most 28 bits: a later event would be written wrapped around, at
    # the wrong time (bounding the whole piece is simpler: 2^28 ticks are 77 h at 120 BPM)
    if last > MAX_MIDI_TICK:
        raise TokenError(f"the tokens reach tick {last:,}, beyond what a MIDI file can hold ({MAX_MIDI_TICK:,}); "
                         "split them into shorter pieces")
    score = symusic.Score(tok.ticks_per_beat_out)
    for s, c in chords:  # chord symbols as markers: DAWs show them, encode reads them back
        score.markers.append(symusic.TextMeta(s * k, chord_mark(c)))
    for name, program, drum, m in tracks(tok, step, dur, pitch, vel, prog):
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
            np.array([tempo_mspq(tok, b) for _, b in tempos], dtype=np.int32),
            ttype="tick",
        )
    if tss:
        score.time_signatures = symusic.TimeSignature.from_numpy(
            np.array([s * k for s, _ in tss], dtype=np.int32),
            np.array([tok.time_signatures[t][0] for _, t in tss], dtype=np.uint8),
            np.array([tok.time_signatures[t][1] for _, t in tss], dtype=np.uint8),
            ttype="tick",
        )
    return score, stats


def decode(tok: Vocabulary, ids, overlaps: str = "trim"):
    """Decode ids to a miditoolkit.MidiFile (ticks_per_beat = beat_resolution * 40); overlaps
    as in decode_to_score."""
    from miditoolkit import Instrument, Marker, MidiFile, Note, TempoChange, TimeSignature

    (step, dur, pitch, vel, prog), tempos, tss, chords = decode_notes(tok, ids, overlaps)
    k = TICKS_PER_STEP_OUT
    mf = MidiFile(ticks_per_beat=tok.ticks_per_beat_out)
    mf.markers = [Marker(chord_mark(c), s * k) for s, c in chords]
    for name, program, drum, m in tracks(tok, step, dur, pitch, vel, prog):
        inst = Instrument(program=program, is_drum=drum, name=name)
        inst.notes = [
            Note(velocity=v, pitch=p, start=s * k, end=(s + d) * k)
            for s, d, p, v in zip(step[m].tolist(), dur[m].tolist(), pitch[m].tolist(), vel[m].tolist())
        ]
        mf.instruments.append(inst)
    mf.tempo_changes = [TempoChange(6e7 / tempo_mspq(tok, b), s * k) for s, b in tempos]
    mf.time_signature_changes = [TimeSignature(*tok.time_signatures[t], s * k) for s, t in tss]
    mf.max_tick = int(max(((step + dur) * k).max(initial=0), 0))
    return mf


def write_midi(tok: Vocabulary, ids, path, overlaps: str = "trim") -> None:
    """Decode ids and write a MIDI file atomically (temporary file + os.replace)."""
    data = decode_to_score(tok, ids, overlaps).dumps_midi()
    write_atomically(data, path)
