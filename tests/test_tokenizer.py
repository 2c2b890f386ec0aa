"""REMI tokenizer: real-data round trips (POP909, Groove), hand-made files, bad input."""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import symusic

from spemusic.errors import MidiError
from spemusic.tokens.grammar import GrammarState, REMIGrammar
from spemusic.tokens.tokenizer import REMITokenizer, TokenError, TokenizerConfig

TOK = REMITokenizer()
RES = TOK.config.beat_resolution
OUT_K = 40  # output ticks per grid step


# --------------------------------------------------------------------------- helpers
def score_notes(score: symusic.Score):
    """(time, duration, pitch, velocity, program code; drums = 128) of all notes."""
    cols = [[], [], [], [], []]
    for tr in score.tracks:
        a = tr.notes.numpy()
        for c, key in zip(cols, ("time", "duration", "pitch", "velocity")):
            c.append(a[key].astype(np.int64))
        cols[4].append(np.full(len(a["time"]), 128 if tr.is_drum else tr.program, dtype=np.int64))
    return tuple(np.concatenate(c) if c else np.zeros(0, np.int64) for c in cols)


def to_step(ticks, tpq):
    return (np.asarray(ticks, dtype=np.int64) * 2 * RES + tpq) // (2 * tpq)


def in_force(ev_steps, ev_vals, default, steps):
    """Value of a step function (events at ev_steps, default before) at steps."""
    ev_steps = np.concatenate(([-(2**40)], np.asarray(ev_steps, dtype=np.int64)))
    ev_vals = np.concatenate(([default], np.asarray(ev_vals, dtype=np.int64)))
    order = np.argsort(ev_steps, kind="stable")
    ev_steps, ev_vals = ev_steps[order], ev_vals[order]
    return ev_vals[np.searchsorted(ev_steps, steps, side="right") - 1]


SAMPLING_GRAMMAR = REMIGrammar(TOK)


def grammar_problems(grammar: REMIGrammar, ids) -> list[str]:
    """[] if ids follow the grammar the sampler masks to (its "valid by construction" rests on
    the tokenizer writing nothing else), else where they leave it."""
    if grammar.is_valid(ids) and ids[-1] == grammar.tok.eos_id:  # (is_valid allows PAD after EOS)
        return []
    bad = grammar.first_violation(ids)
    if bad is None:
        return ["REMIGrammar: does not end with EOS"]
    return [f"REMIGrammar rejects token {bad} ({grammar.tok.ids_to_tokens(ids[max(0, bad - 3):bad + 1])})"]


def check_file(path) -> dict:
    """Round-trip one real file; return counts and problems."""
    r = {"files": 1, "notes": 0, "decoded": 0, "clipped": 0, "duplicates": 0, "ts_mismatch": 0, "problems": []}
    prob = r["problems"]
    ids, st = TOK.encode_with_stats(path)
    prob += grammar_problems(SAMPLING_GRAMMAR, ids)
    data = TOK.decode_to_score(ids, "layers").dumps_midi()
    ids2 = TOK.encode(data)
    if not np.array_equal(ids, ids2):
        prob.append("encode(decode(encode(f))) != encode(f)")
    orig = symusic.Score(str(path))
    dec = symusic.Score.from_midi(data)
    tpq = orig.ticks_per_quarter
    assert dec.ticks_per_quarter == RES * OUT_K
    o_t, o_d, o_p, o_v, o_g = score_notes(orig)
    d_t, d_d, d_p, d_v, d_g = score_notes(dec)
    r["notes"], r["decoded"] = len(o_t), len(d_t)
    # onsets: on the grid, at most half a step from the original
    q = to_step(o_t, tpq)
    if (2 * np.abs(o_t * RES - q * tpq) > tpq).any():
        prob.append("onset error above half a grid step")
    if (d_t % OUT_K).any():
        prob.append("decoded onset off the grid")
    d_q = d_t // OUT_K
    # durations in steps, binned; velocities binned
    o_ds = np.maximum(to_step(o_d, tpq), 1)
    o_drum, d_drum = o_g == 128, d_g == 128
    o_db = np.where(o_drum, 0, TOK.duration_bin(o_ds))
    d_db = np.where(d_drum, 0, TOK.duration_bin(d_d // OUT_K))
    o_vb, d_vb = TOK.velocity_bin(o_v), TOK.velocity_bin(d_v)
    oo = np.lexsort((-o_vb, -o_db, o_p, o_g, q))
    do = np.lexsort((-d_vb, -d_db, d_p, d_g, d_q))
    if len(oo) != len(do):
        prob.append(f"{len(o_t)} notes in, {len(d_t)} out")
        return r
    for name, a, b in (("program/drum", o_g, d_g), ("pitch", o_p, d_p), ("onset", q, d_q), ("velocity bin", o_vb, d_vb)):
        if not np.array_equal(a[oo], b[do]):
            prob.append(f"{name} differs")
    if not np.array_equal(d_v, TOK.velocity_values[d_vb]):
        prob.append("decoded velocity is not its bin's value")
    nd = ~o_drum[oo]
    clipped = o_ds[oo] > TOK.max_duration_steps
    r["clipped"] = int((clipped & nd).sum())
    dd = (d_d // OUT_K)[do]
    want = TOK.duration_steps[TOK.duration_bin(o_ds[oo])]
    if not np.array_equal(dd[nd], want[nd]):
        prob.append("duration bin differs")
    if (dd[nd & clipped] != TOK.max_duration_steps).any():
        prob.append("clipped duration not at the longest bin")
    keys = np.stack([q, o_g, o_p])[:, oo]
    r["duplicates"] = int(np.all(keys[:, 1:] == keys[:, :-1], axis=0).sum())
    # tempo in force at each onset (tempo events count from the step they round to)
    ot, dt_ = orig.tempos.numpy(), dec.tempos.numpy()
    o_tb = in_force(to_step(np.maximum(ot["time"], 0), tpq), TOK.tempo_bin(6e7 / ot["mspq"]), TOK.tempo_bin(120.0), q[oo])
    d_tb = in_force(dt_["time"] // OUT_K, TOK.tempo_bin(6e7 / dt_["mspq"]), TOK.tempo_bin(120.0), d_q[do])
    if not np.array_equal(o_tb, d_tb):
        prob.append(f"tempo bin differs at {int((o_tb != d_tb).sum())} notes")
    # time signature in force at each onset (mapped to the allowed set)
    default_ts = TOK.map_time_signature(4, 4)
    os_, ds_ = orig.time_signatures.numpy(), dec.time_signatures.numpy()
    o_ts = in_force(to_step(os_["time"], tpq),
                    [TOK.map_time_signature(n, d) for n, d in zip(os_["numerator"], os_["denominator"])], default_ts, q[oo])
    d_ts = in_force(ds_["time"] // OUT_K,
                    [TOK.map_time_signature(n, d) for n, d in zip(ds_["numerator"], ds_["denominator"])], default_ts, d_q[do])
    r["ts_mismatch"] = int((o_ts != d_ts).sum())
    if r["ts_mismatch"] and not st["ts_changes_moved"] and not _has_short_bar(orig):
        prob.append("time signature differs")
    if st["notes"] != len(o_t) or st["notes_encoded"] != len(d_t) or st["clipped_durations"] != r["clipped"]:
        prob.append(f"stats disagree: {st}")
    return r


def _has_short_bar(score: symusic.Score) -> bool:
    """True if a time-signature change falls inside a bar (the short bar gets its own TimeSig)."""
    ts = score.time_signatures.numpy()
    tpq = score.ticks_per_quarter
    for j in range(1, len(ts["time"])):
        length = Fraction(4 * int(ts["numerator"][j - 1]) * tpq, int(ts["denominator"][j - 1]))
        if Fraction(int(ts["time"][j] - ts["time"][j - 1])) % length:
            return True
    return False


def _map(check, files: list[Path]) -> list:
    procs = min(2, os.cpu_count() or 1)
    if procs > 1 and len(files) > 50:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(procs) as pool:
            return pool.map(check, files, chunksize=16)
    return [check(f) for f in files]


def _run_dataset(files: list[Path]) -> dict:
    total = {"files": 0, "notes": 0, "decoded": 0, "clipped": 0, "duplicates": 0, "ts_mismatch": 0}
    failures = []
    results = _map(check_file, files)
    for f, r in zip(files, results):
        for k in total:
            total[k] += r[k]
        if r["problems"]:
            failures.append(f"{f}: {'; '.join(r['problems'])}")
    total["failures"] = failures
    return total


# --------------------------------------------------------------------------- real data
@pytest.mark.parametrize("dataset,pattern,expected", [("pop909", "*.mid", 809), ("groove", "**/*.mid", 1021)])
def test_real_data_round_trip(shared_data, dataset, pattern, expected):
    files = sorted((shared_data / dataset).glob(pattern))
    assert len(files) == expected, f"{dataset}: expected {expected} files, found {len(files)}"
    t = _run_dataset(files)
    print(
        f"\n{dataset}: {t['files']} files, {t['notes']} notes, {t['decoded']} decoded, "
        f"{t['duplicates']} doublings kept, {t['clipped']} durations clipped, "
        f"{t['ts_mismatch']} notes under a moved time-signature change"
    )
    assert not t["failures"], f"{len(t['failures'])} files failed:\n" + "\n".join(t["failures"][:20])
    dropped = t["notes"] - t["decoded"]
    assert dropped <= 0.001 * t["notes"], f"{dropped} of {t['notes']} notes dropped"
    assert t["ts_mismatch"] <= 0.001 * t["notes"]


TOK_CHORDS = REMITokenizer(TokenizerConfig(chords=True))  # the vocabulary of pop-piano
CHORD_GRAMMAR = REMIGrammar(TOK_CHORDS)


def check_annotated(path: Path) -> list[str]:
    """A POP909 song tokenized on its beat and chord annotations, as pop-piano was trained on it:
    the problems of its tokens (grammar, round trip)."""
    pop = path.parent
    ids = TOK_CHORDS.encode(path, beats=pop / "beats" / f"{path.stem}.txt", chords=pop / "chords" / f"{path.stem}.txt")
    prob = grammar_problems(CHORD_GRAMMAR, ids)
    if not np.array_equal(TOK_CHORDS.encode(TOK_CHORDS.decode_to_score(ids, "layers").dumps_midi()), ids):
        prob.append("encode(decode(ids)) != ids")
    return prob


def test_pop909_on_its_beats_and_chords_round_trip(shared_data):
    files = sorted((shared_data / "pop909").glob("*.mid"))
    assert len(files) == 809, f"pop909: expected 809 files, found {len(files)}"
    failures = [f"{f}: {'; '.join(p)}" for f, p in zip(files, _map(check_annotated, files)) if p]
    assert not failures, f"{len(failures)} files failed:\n" + "\n".join(failures[:20])


def test_truncated_real_file(shared_data, tmp_path):
    data = (shared_data / "pop909" / "001.mid").read_bytes()
    for cut in (20, 300, len(data) // 2):
        bad = tmp_path / f"cut{cut}.mid"
        bad.write_bytes(data[:cut])
        with pytest.raises(MidiError) as e:
            TOK.encode(bad)
        msg = str(e.value)
        assert str(bad) in msg and "\n" not in msg and "corrupt" in msg


def test_encode_inputs_agree(shared_data):
    import miditoolkit

    path = shared_data / "pop909" / "001.mid"
    ids = TOK.encode(path)
    assert ids.dtype == np.int32
    assert np.array_equal(ids, TOK.encode(str(path)))
    assert np.array_equal(ids, TOK.encode(path.read_bytes()))
    assert np.array_equal(ids, TOK.encode(symusic.Score(str(path))))
    assert np.array_equal(ids, TOK.encode(miditoolkit.MidiFile(str(path))))


def test_miditoolkit_decode_round_trip(shared_data, tmp_path):
    files = sorted((shared_data / "pop909").glob("*.mid"))[:5] + sorted((shared_data / "groove").glob("**/*.mid"))[:5]
    for f in files:
        ids = TOK.encode(f)
        mf = TOK.decode(ids, "layers")
        assert mf.ticks_per_beat == RES * OUT_K
        assert np.array_equal(TOK.encode(mf), ids), f
        out = tmp_path / "mtk.mid"
        mf.dump(str(out))
        assert np.array_equal(TOK.encode(out), ids), f


# --------------------------------------------------------------------------- config and vocabulary
def test_config_dict_and_fingerprint():
    c = TokenizerConfig()
    assert TokenizerConfig.from_dict(c.to_dict()) == c
    import json

    assert TokenizerConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert c.fingerprint() == TokenizerConfig().fingerprint()
    assert len(c.fingerprint()) >= 8
    assert TokenizerConfig(beat_resolution=4).fingerprint() != c.fingerprint()
    assert TokenizerConfig(num_velocity_bins=16).fingerprint() != c.fingerprint()
    with pytest.raises(ValueError):
        TokenizerConfig.from_dict({**c.to_dict(), "bogus": 1})
    with pytest.raises(ValueError):
        TokenizerConfig(time_signatures=((9, 4),))  # longer than max_bar_beats


def test_vocabulary_layout():
    v = TOK.vocab
    assert v[:4] == ["PAD", "BOS", "EOS", "Bar"]
    assert (TOK.pad_id, TOK.bos_id, TOK.eos_id, TOK.bar_id) == (0, 1, 2, 3)
    assert len(TOK) == len(v) == len(TOK.token_to_id)
    prev = 4
    for kind in ("TimeSig", "Position", "Tempo", "Program", "Pitch", "Velocity", "Duration"):
        a, b = TOK.range(kind)
        assert a == prev and b > a and all(t.startswith(kind + "_") for t in v[a:b])
        prev = b
    assert prev == len(v)
    assert TOK.range("Position")[1] - TOK.range("Position")[0] == 8 * RES
    assert v[TOK.drum_program_id] == "Program_drums" and TOK.drum_program_id == TOK.range("Program")[1] - 1
    for ts in ("4/4", "3/4", "7/8", "6/8", "2/2", "12/8", "1/4"):
        assert f"TimeSig_{ts}" in TOK.token_to_id
    with pytest.raises(ValueError):
        TOK.range("Nope")


def test_bins_decode_into_themselves():
    nv = TOK.config.num_velocity_bins
    assert np.array_equal(TOK.velocity_bin(TOK.velocity_values), np.arange(nv))
    assert np.array_equal(TOK.duration_bin(TOK.duration_steps), np.arange(len(TOK.duration_steps)))
    mspq = np.round(6e7 / TOK.tempo_values)
    assert np.array_equal(TOK.tempo_bin(6e7 / mspq), np.arange(TOK.config.num_tempo_bins))
    assert TOK.tempo_bin(10.0) == 0 and TOK.tempo_bin(1000.0) == TOK.config.num_tempo_bins - 1
    ds = TOK.duration_steps.tolist()
    for x in list(range(1, 13)) + [16, 24, 48, 96]:  # every step to a beat, half-note triplet, 2/4/8 beats
        assert x in ds


def test_map_time_signature():
    ts = TOK.config.time_signatures
    assert ts[TOK.map_time_signature(12, 16)] == (6, 8)  # same bar length, closest denominator
    assert ts[TOK.map_time_signature(6, 16)] in ((3, 8),)
    assert ts[TOK.map_time_signature(9, 4)] == (8, 4)  # nearest bar length
    assert ts[TOK.map_time_signature(4, 4)] == (4, 4)


# --------------------------------------------------------------------------- hand-made files
def tokens_of(path_or_ids):
    ids = TOK.encode(path_or_ids) if not isinstance(path_or_ids, np.ndarray) else path_or_ids
    assert not grammar_problems(SAMPLING_GRAMMAR, ids), grammar_problems(SAMPLING_GRAMMAR, ids)
    return TOK.ids_to_tokens(ids)


def round_trip_ok(ids):
    assert np.array_equal(TOK.encode(TOK.decode_to_score(ids, "layers").dumps_midi()), ids)


@pytest.mark.parametrize("tpq", [96, 1000, 480, 384])
def test_odd_ticks_per_beat(midi_factory, tpq):
    # quarter, 16th, 8th-triplet positions (in beats) in bar 0 and bar 1
    beats = [Fraction(0), Fraction(1, 4), Fraction(1, 3), Fraction(2, 3), Fraction(5, 2), Fraction(4), Fraction(17, 4)]
    notes = [(0, False, 60 + i, round(b * tpq), round(b * tpq) + tpq // 2, 100) for i, b in enumerate(beats)]
    ids, st = TOK.encode_with_stats(midi_factory(notes=notes, ticks_per_beat=tpq))
    toks = tokens_of(ids)
    pos = [int(t.split("_")[1]) for t in toks if t.startswith("Position_")]
    assert pos == [0, 3, 4, 8, 30, 0, 3]
    assert toks.count("Bar") == 2
    assert st["max_onset_error_ticks"] < tpq / RES / 2
    dec = TOK.decode(ids)
    starts = sorted(n.start for n in dec.instruments[0].notes)
    assert starts == [int(b * 480) for b in beats]
    round_trip_ok(ids)


def test_triplets_exact(midi_factory):
    notes = [(0, False, 60, k * 160, k * 160 + 160, 80) for k in range(12)]  # 8th triplets, tpq 480
    notes += [(0, False, 72, k * 320, k * 320 + 320, 80) for k in range(6)]  # quarter triplets
    ids, st = TOK.encode_with_stats(midi_factory(notes=notes))
    assert st["moved_onsets"] == 0 and st["max_onset_error_ticks"] == 0
    dec = TOK.decode_to_score(ids)
    got = sorted((n.time, n.duration, n.pitch) for n in dec.tracks[0].notes)
    assert got == sorted((s, e - s, p) for _, _, p, s, e, _ in notes)
    round_trip_ok(ids)


def test_time_signatures_and_change(midi_factory):
    tpq = 480
    # bar 0: 3/4 (3 beats), bar 1: 3/4, then 7/8 from beat 6 (3.5 beats per bar), then 4/4 from 6+7 = 13
    ts = ((3, 4, 0), (7, 8, 6 * tpq), (4, 4, 13 * tpq))
    onsets = [0, 1, 2, 3, 5.5, 6, 9, 9.5, 12.5, 13, 16]
    notes = [(0, False, 60, int(b * tpq), int(b * tpq) + 240, 90) for b in onsets]
    ids = TOK.encode(midi_factory(notes=notes, time_signatures=ts))
    toks = tokens_of(ids)
    assert [t for t in toks if t.startswith("TimeSig")] == ["TimeSig_3/4", "TimeSig_7/8", "TimeSig_4/4"]
    assert toks.count("Bar") == 5  # bars start at beats 0, 3 (3/4) | 6, 9.5 (7/8) | 13 (4/4, holds 16)
    bars = np.split(np.array(toks), TOK.bar_starts(ids)[1:])
    pos = [[int(t.split("_")[1]) for t in b if t.startswith("Position")] for b in bars]
    assert pos == [[0, 12, 24], [0, 30], [0, 36], [0, 36], [0, 36]]
    dec = TOK.decode(ids)
    assert ([(t.numerator, t.denominator, t.time) for t in dec.time_signature_changes]
            == [(3, 4, 0), (7, 8, 6 * 480), (4, 4, 13 * 480)])
    assert sorted(n.start for n in dec.instruments[0].notes) == [int(b * 480) for b in onsets]
    round_trip_ok(ids)


def test_time_signature_change_inside_bar(midi_factory):
    # 4/4, then 3/4 from beat 6 (inside bar 1): bar 1 is cut to 2 beats and written as 2/4
    ts = ((4, 4, 0), (3, 4, 6 * 480))
    notes = [(0, False, 60, b * 480, b * 480 + 240, 90) for b in (0, 4, 5, 6, 9)]
    ids = TOK.encode(midi_factory(notes=notes, time_signatures=ts))
    toks = tokens_of(ids)
    assert [t for t in toks if t.startswith("TimeSig")] == ["TimeSig_4/4", "TimeSig_2/4", "TimeSig_3/4"]
    assert sorted(n.start for n in TOK.decode(ids).instruments[0].notes) == [b * 480 for b in (0, 4, 5, 6, 9)]
    round_trip_ok(ids)


def test_no_time_signature_is_4_4_and_note_on_bar_line(midi_factory):
    # tick 1915 rounds to step 48 = the next bar line: it belongs to bar 1, position 0
    notes = [(0, False, 60, 0, 100, 90), (0, False, 62, 1915, 2000, 90)]
    ids = TOK.encode(midi_factory(notes=notes, time_signatures=()))
    toks = tokens_of(ids)
    assert toks[:4] == ["BOS", "Bar", "TimeSig_4/4", "Position_0"]
    i = [j for j, t in enumerate(toks) if t == "Bar"][1]
    assert toks[i + 1] == "Position_0"


def test_empty_bars_are_lone_bar_tokens(midi_factory):
    notes = [(0, False, 60, 0, 480, 90), (0, False, 62, 3 * 1920 + 480, 3 * 1920 + 960, 90)]
    toks = tokens_of(midi_factory(notes=notes))
    i = [j for j, t in enumerate(toks) if t == "Bar"]
    assert len(i) == 4
    assert toks[i[1] + 1] == "Bar" and toks[i[2] + 1] == "Bar" and toks[i[3] + 1] == "Position_12"


def test_tempo_change(midi_factory):
    tempos = ((120.0, 0), (90.0, 8 * 480 + 100), (90.5, 12 * 480))  # second change stays in the same bin
    notes = [(0, False, 60, b * 480, b * 480 + 240, 90) for b in (0, 4, 8, 9, 12, 13)]
    ids = TOK.encode(midi_factory(notes=notes, tempos=tempos))
    toks = tokens_of(ids)
    tempo_toks = [(toks[j - 1], t) for j, t in enumerate(toks) if t.startswith("Tempo")]
    b120, b90 = int(TOK.tempo_bin(120.0)), int(TOK.tempo_bin(90.0))
    # the change at beat 8 + 100 ticks rounds to step 8*12+3: the first onset at/after it is beat 9
    assert tempo_toks == [("Position_0", f"Tempo_{b120}"), ("Position_12", f"Tempo_{b90}")]
    dec = TOK.decode(ids)
    got = [(round(t.tempo, 2), t.time) for t in dec.tempo_changes]
    assert [t for _, t in got] == [0, 9 * 480]
    assert [int(TOK.tempo_bin(b)) for b, _ in got] == [b120, b90]
    round_trip_ok(ids)


def test_programs_and_drums(midi_factory):
    notes = [
        (33, False, 40, 0, 480, 100),  # bass
        (0, False, 64, 0, 960, 80),  # piano
        (0, False, 60, 0, 960, 80),
        (0, True, 36, 0, 10, 120),  # kick
        (0, True, 42, 0, 10, 70),  # hi-hat
        (25, False, 67, 240, 480, 60),
        (0, True, 42, 240, 250, 60),
    ]
    ids = TOK.encode(midi_factory(notes=notes))
    toks = tokens_of(ids)
    first = toks[toks.index("Position_0") + 2 :]
    first = first[: first.index("Position_6")]
    progs = [(t, first[j + 1]) for j, t in enumerate(first) if t.startswith("Program")]
    assert progs == [("Program_0", "Pitch_60"), ("Program_0", "Pitch_64"), ("Program_33", "Pitch_40"),
                     ("Program_drums", "Pitch_36"), ("Program_drums", "Pitch_42")]
    for j, t in enumerate(toks):  # drums carry no duration, others do
        if t == "Program_drums":
            assert toks[j + 3].startswith(("Program", "Position", "Bar", "EOS"))
        elif t.startswith("Program"):
            assert toks[j + 3].startswith("Duration")
    dec = TOK.decode(ids)
    insts = {(i.program, i.is_drum): i for i in dec.instruments}
    assert set(insts) == {(0, False), (25, False), (33, False), (0, True)}
    assert sorted(n.pitch for n in insts[(0, True)].notes) == [36, 42, 42]
    assert insts[(33, False)].name == "Electric Bass (finger)"
    score = TOK.decode_to_score(ids)
    assert any(t.is_drum for t in score.tracks)
    round_trip_ok(ids)


def test_duplicates_and_overlaps_kept(midi_factory):
    # the same note in two tracks (program 0 both) and an overlapping repeat of a pitch
    from miditoolkit import Instrument, MidiFile, Note

    mf = MidiFile(ticks_per_beat=480)
    a, b = Instrument(0, name="melody"), Instrument(0, name="piano")
    a.notes = [Note(100, 60, 0, 480), Note(90, 62, 480, 1920)]
    b.notes = [Note(60, 60, 0, 960), Note(70, 62, 960, 1200)]  # 62 re-struck while the first still sounds
    mf.instruments = [a, b]
    ids, st = TOK.encode_with_stats(mf)
    assert st["dropped_duplicates"] == 0 and st["duplicate_notes"] == 1 and st["notes_encoded"] == 4
    trimmed = TOK.decode_to_score(ids)  # what a MIDI player plays: the re-struck 62 ends the first
    assert len(trimmed.tracks) == 1
    assert sorted((n.time, n.duration, n.pitch) for n in trimmed.tracks[0].notes) == [(0, 960, 60), (480, 480, 62),
                                                                                        (960, 240, 62)]
    score = TOK.decode_to_score(ids, "layers")
    assert sum(len(t.notes) for t in score.tracks) == 4
    assert len(score.tracks) == 2  # a layer track holds the overlapping notes
    round_trip_ok(ids)
    got = sorted((n.time, n.duration, n.pitch) for t in symusic.Score.from_midi(score.dumps_midi()).tracks for n in t.notes)
    assert got == [(0, 480, 60), (0, 960, 60), (480, 1440, 62), (960, 240, 62)]


def test_long_durations_clipped_and_counted(midi_factory):
    notes = [(0, False, 60, 0, 480 * 20, 90), (0, False, 64, 0, 480 * 3, 90)]
    ids, st = TOK.encode_with_stats(midi_factory(notes=notes))
    assert st["clipped_durations"] == 1
    durs = sorted(n.end - n.start for n in TOK.decode(ids).instruments[0].notes)
    assert durs == [480 * 3, 480 * 8]


def test_token_strings_round_trip(midi_factory):
    ids = TOK.encode(midi_factory(notes=[(0, False, 60, 0, 480, 90), (0, True, 38, 480, 500, 100)]))
    toks = TOK.ids_to_tokens(ids)
    assert all(isinstance(t, str) for t in toks)
    back = TOK.tokens_to_ids(toks)
    assert back.dtype == np.int32 and np.array_equal(back, ids)
    with pytest.raises(TokenError, match="Pitch_999"):
        TOK.tokens_to_ids(["BOS", "Pitch_999"])
    with pytest.raises(ValueError):
        TOK.tokens_to_ids(["Nonsense"])
    with pytest.raises(MidiError):
        TOK.ids_to_tokens([len(TOK)])


def test_bar_starts(midi_factory):
    ids = TOK.encode(midi_factory(notes=[(0, False, 60, 0, 480, 90), (0, False, 60, 1920 * 2, 1920 * 2 + 480, 90)]))
    bs = TOK.bar_starts(ids)
    assert len(bs) == 3 and all(ids[bs] == TOK.bar_id)


def test_decode_is_robust_to_odd_sequences():
    rng = np.random.default_rng(0)
    for n in (0, 1, 5, 50, 500):
        for _ in range(20):
            ids = rng.integers(0, len(TOK), size=n)
            TOK.decode(ids)
            TOK.decode_to_score(ids).dumps_midi()
    # out-of-range ids, a note cut short, Position before any Bar, Duration after a drum note
    odd = [TOK.bos_id, 99999, -3, TOK.token_to_id["Position_5"], TOK.token_to_id["Program_0"], TOK.token_to_id["Pitch_60"],
           TOK.token_to_id["Bar"], TOK.drum_program_id, TOK.token_to_id["Pitch_36"], TOK.token_to_id["Velocity_3"],
           TOK.token_to_id["Duration_3"], TOK.eos_id, TOK.token_to_id["Bar"]]
    mf = TOK.decode(odd)
    assert [len(i.notes) for i in mf.instruments] == [1]


def test_decode_counts_the_notes_it_cannot_form(midi_factory):
    ids = TOK.encode(midi_factory(notes=[(0, False, 60, 0, 480, 90), (0, False, 60, 0, 240, 80), (0, True, 38, 480, 500, 100)]))
    score, stats = TOK.decode_with_stats(ids)
    assert stats == {"notes": 3, "lost_notes": 0}  # the doubled 60 is formed, then trimmed
    assert score.dumps_midi() == TOK.decode_to_score(ids).dumps_midi()
    vel = [j for j, t in enumerate(TOK.ids_to_tokens(ids)) if t.startswith("Velocity")]
    cut = np.concatenate((np.delete(ids, vel[0]), ids[-5:-1]))  # a note without its Velocity; one after EOS
    score, stats = TOK.decode_with_stats(cut, "layers")
    assert stats == {"notes": 2, "lost_notes": 2}
    assert sum(len(t.notes) for t in score.tracks) == 2


def test_write_midi_atomic(tmp_path, midi_factory):
    ids = TOK.encode(midi_factory(notes=[(0, False, 60, 0, 480, 90)]))
    out = tmp_path / "out" / "x.mid"
    out.parent.mkdir()
    TOK.write_midi(ids, out)
    assert np.array_equal(TOK.encode(out), ids)
    assert [p.name for p in out.parent.iterdir()] == ["x.mid"]


def test_other_config(midi_factory):
    tok = REMITokenizer(TokenizerConfig(beat_resolution=4, num_velocity_bins=8, max_bar_beats=4, max_duration_beats=4))
    notes = [(0, False, 60, 0, 480, 90), (0, False, 62, 600, 700, 40)]
    ids = tok.encode(midi_factory(notes=notes, time_signatures=((3, 4, 0),)))
    assert not grammar_problems(REMIGrammar(tok), ids)
    assert tok.decode_to_score(ids).ticks_per_quarter == 160
    assert np.array_equal(tok.encode(tok.decode_to_score(ids).dumps_midi()), ids)


# --------------------------------------------------------------------------- bad input
def _bad(path, words):
    with pytest.raises(MidiError) as e:
        TOK.encode(path)
    msg = str(e.value)
    assert str(path) in msg, msg
    assert "\n" not in msg and len(msg) < 300, msg
    assert words in msg, msg


def test_bad_inputs(tmp_path, midi_factory):
    empty = tmp_path / "empty.mid"
    empty.write_bytes(b"")
    _bad(empty, "empty file")
    garbage = tmp_path / "garbage.mid"
    garbage.write_bytes(os.urandom(2000).replace(b"MThd", b"xxxx"))
    _bad(garbage, "not a MIDI file")
    text = tmp_path / "notes.mid"
    text.write_text("this is not midi\n" * 20)
    _bad(text, "not a MIDI file")
    header_only = tmp_path / "header.mid"
    header_only.write_bytes(b"MThd\x00\x00\x00\x06\x00\x01\x00\x05\x01\xe0MTrk\x00\x00\x10\x00\x00\x90")
    _bad(header_only, "corrupt")
    good = midi_factory(notes=[(0, False, 60, 0, 480, 90)] * 1 + [(0, False, 62, 480, 960, 90)])
    cut = tmp_path / "cut.mid"
    cut.write_bytes(good.read_bytes()[:-12])
    _bad(cut, "corrupt")
    noteless = midi_factory("noteless.mid", notes=[])
    _bad(noteless, "no notes")
    _bad(tmp_path / "missing.mid", "no such file")
    _bad(tmp_path, "is a folder")
    with pytest.raises(MidiError, match="no notes"):
        import miditoolkit

        TOK.encode(miditoolkit.MidiFile())
    with pytest.raises(TypeError):
        TOK.encode(12345)


def test_times_beyond_what_midi_holds_are_refused(tmp_path):
    import struct

    # 70,001 bars of 8/4 and then a note: 268.8M output ticks, more than a MIDI delta time holds
    ids = TOK.tokens_to_ids(["BOS", "Bar", "TimeSig_8/4", "Position_0", "Tempo_10", "Program_0", "Pitch_60",
                             "Velocity_20", "Duration_12"] + ["Bar"] * 70_000 +
                            ["Position_0", "Program_0", "Pitch_62", "Velocity_20", "Duration_12", "EOS"])
    with pytest.raises(TokenError, match="beyond what a MIDI file can hold"):
        TOK.decode_to_score(ids)
    # a note at tick 2^31 (delta times of 2^28 - 1, eight of them, then more) reads back negative in 32 bits
    vlq = bytes([0xFF, 0xFF, 0xFF, 0x7F])  # 2^28 - 1
    track = (vlq + bytes([0xFF, 0x01, 0x00])) * 8 + bytes([0x10, 0x90, 0x3C, 0x64, 0x10, 0x80, 0x3C, 0x40,
                                                        0x00, 0xFF, 0x2F, 0x00])
    far = tmp_path / "far.mid"
    far.write_bytes(b"MThd" + struct.pack(">IHHH", 6, 0, 1, 480) + b"MTrk" + struct.pack(">I", len(track)) + track)
    with pytest.raises(MidiError, match="beyond tick 2"):
        TOK.encode(far)


@pytest.mark.parametrize("strict", [True, False])
def test_grammar_caps_notes_per_onset(strict):
    """At most max_notes_per_onset notes at one Position, doubled notes included: a model that
    lost count of its notes once stacked 44 at one onset, doubling the top pitch."""
    grammar = REMIGrammar(TOK, strict_order=strict, max_notes_per_onset=4)
    head = ["BOS", "Bar", "TimeSig_4/4", "Position_0", "Tempo_10"]
    # strict order: a doubled pitch comes longest first
    notes = [["Program_0", f"Pitch_{60 if strict else 60 + i}", "Velocity_20", f"Duration_{9 - i}"] for i in range(4)]
    prog_lo, prog_hi = TOK.range("Program")
    for n in range(1, 5):
        ids = TOK.tokens_to_ids(head + sum(notes[:n], []))
        bad, st = grammar._walk(ids)
        assert bad is None, TOK.ids_to_tokens(ids)[bad]
        allowed = grammar.allowed(st)
        assert allowed[prog_lo:prog_hi].any() == (n < 4), n
        assert allowed[TOK.bar_id] and allowed[TOK.range("Position")[0] + 1]  # time can always move on
    assert grammar.is_valid(TOK.tokens_to_ids(head + sum(notes, []) + ["EOS"]))


def test_grammar_knows_where_the_sound_ends(shared_data):
    """GrammarState.sounding (where the last note to end ends, from the bar's start) says at every
    onset whether a note still sounds, as the piano roll of the same tokens does: on a real song
    re-barred by its beat annotation (bars of several lengths, pickup, chord changes). In time
    order: melody first, a melody onset cannot know the accompaniment still to come in its bar."""
    from spemusic.music.metrics import note_grid, sounding
    from spemusic.nn.checkpoint import load_model

    _, shipped = load_model("pop-piano")
    tok = REMITokenizer(TokenizerConfig.from_dict({**shipped.config.to_dict(), "melody_first": False, "chord_every_bar": False,
                                                           "repeats": False, "copies": False}))
    pop = shared_data / "pop909"
    ids = tok.encode(pop / "003.mid", beats=pop / "beats" / "003.txt", chords=pop / "chords" / "003.txt")
    grid = note_grid(ids, tok)
    sound = sounding(grid)
    grammar, st = REMIGrammar(tok), GrammarState()
    pos_lo, pos_hi = tok.range("Position")
    bar, checked = -1, 0
    for t in map(int, ids):
        if t == tok.bar_id and st.sounding is not None and bar + 1 < grid.n_bars:  # a bar line ends the bar
            assert (st.sounding >= st.bar_len) == bool(sound[grid.bar_start[bar + 1] - 1]), bar
        if t == tok.bar_id:
            bar += 1
        if pos_lo <= t < pos_hi and st.sounding is not None:
            at = grid.bar_start[bar] + t - pos_lo
            assert (st.sounding >= t - pos_lo) == bool(sound[at - 1]), (bar, t - pos_lo)
            checked += 1
        grammar.advance(st, t)
    assert checked > 500


def test_drum_grid_puts_each_hit_on_its_sixteenth_or_triplet(tmp_path):
    """drum_grid: a hit a little early or late lands on the nearest sixteenth or eighth-note
    triplet (a tie on the sixteenth); pitched notes keep their steps; the grid is stable."""
    from miditoolkit import Instrument, MidiFile, Note

    from spemusic.errors import ConfigError
    from spemusic.music.metrics import note_grid

    mf = MidiFile(ticks_per_beat=480)
    drums = Instrument(program=0, is_drum=True, name="drums")
    # steps (of 12 a beat) 1, 2, 5, 7, 10, 11 -> 0, 3, 6, 6, 9, 12; 4 and 8 (triplets) stay
    for k, step in enumerate((1, 2, 5, 7, 10, 11, 4, 8)):
        t = (4 * k * 12 + step) * 40  # one hit a bar, 40 ticks a step
        drums.notes.append(Note(velocity=90, pitch=36 + k, start=t, end=t + 40))
    piano = Instrument(program=0, name="piano")
    piano.notes.append(Note(velocity=80, pitch=60, start=40, end=480))
    mf.instruments = [drums, piano]
    path = tmp_path / "d.mid"
    mf.dump(str(path))
    tok = REMITokenizer(TokenizerConfig(drum_grid=True))
    ids = tok.encode(path)
    g = note_grid(ids, tok)
    hits = sorted(zip(g.onset[g.drum].tolist(), g.pitch[g.drum].tolist()))
    assert [on - 48 * k for k, (on, _) in enumerate(hits)] == [0, 3, 6, 6, 9, 12, 4, 8]
    assert g.onset[~g.drum].tolist() == [1]  # the piano's step is its own
    assert np.array_equal(tok.encode(tok.decode_to_score(ids)), ids)
    assert REMITokenizer().config.fingerprint() != tok.config.fingerprint()
    with pytest.raises(ConfigError, match="drum_grid"):
        TokenizerConfig(drum_grid=True, beat_resolution=8)
