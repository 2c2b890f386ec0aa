"""Bars from beat annotations, chord tokens, forced chords, and overlapping notes at decode."""

from __future__ import annotations

import json

import miditoolkit
import numpy as np
import pytest

from spemusic.errors import MidiError, SpemusicError
from spemusic.music.metrics import chord_match, note_grid, summary
from spemusic.tokens.chords import CHORD_NAMES, parse_chord, parse_chords
from spemusic.tokens.grammar import REMIGrammar
from spemusic.tokens.tokenizer import REMITokenizer, TokenizerConfig
from spemusic.training.data import WindowSampler, prepare

TOK = REMITokenizer(TokenizerConfig(chords=True))
TPQ = 480


def _beats_file(path, times, downbeats, two_columns=False):
    """A beat annotation: POP909's three columns, or madmom's 'time beat-in-bar'."""
    lines, k = [], 0
    for t, d in zip(times, downbeats):
        k = 1 if d else k + 1
        lines.append(f"{t:.6f}\t{k}" if two_columns else f"{t:.6f} {k % 2:.1f} {1.0 if d else 0.0}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _bars(ids):
    """[(time signature, [positions of the bar's onsets])] of a token sequence."""
    out, ts = [], None
    for t in TOK.ids_to_tokens(ids):
        if t == "Bar":
            out.append([ts, []])
        elif t.startswith("TimeSig_"):
            ts = out[-1][0] = t.split("_")[1]
        elif t.startswith("Position_"):
            out[-1][1].append(int(t.split("_")[1]))
    return [(a, b) for a, b in out]


def test_bars_follow_downbeats_at_odd_offsets_with_pickup_and_a_short_bar(tmp_path, midi_factory):
    # 120 BPM (0.5 s a beat); the file says 1/4, the music is: a one-beat pickup, then 4/4, one
    # inserted 2/4 bar, 4/4 again; every beat is 1/12 beat (40 ticks) after the file's grid, and
    # each note sits on a beat or an eighth after it
    off = 40
    beat_ticks = [off + TPQ * k for k in range(16)]
    downbeat = [False, True, False, False, False, True, False, False, False, True, False, True, False, False,
                False, True]
    notes = [(0, False, 60 + k % 12, t, t + 200, 80) for k, t in enumerate(beat_ticks[:-1])]
    notes.append((0, False, 72, beat_ticks[2] + TPQ // 2, beat_ticks[2] + TPQ // 2 + 100, 80))
    mid = midi_factory("odd.mid", notes, time_signatures=((1, 4, 0),))
    beats = _beats_file(tmp_path / "odd.txt", [t / TPQ * 0.5 for t in beat_ticks], downbeat)
    ids, stats = TOK.encode_with_stats(mid, beats=beats)
    bars = _bars(ids)
    assert [b[0] for b in bars] == ["1/4", "4/4", "4/4", "2/4", "4/4"]
    assert bars[0][1] == [0]                        # the pickup
    assert bars[1][1] == [0, 12, 18, 24, 36]        # beats and the eighth after beat 2: exact
    assert bars[3][1] == [0, 12]
    assert stats["max_onset_error_ticks"] == 0 and stats["notes_encoded"] == len(notes)
    # two-column form, same bars
    beats2 = _beats_file(tmp_path / "odd2.txt", [t / TPQ * 0.5 for t in beat_ticks], downbeat, two_columns=True)
    assert np.array_equal(TOK.encode(mid, beats=beats2), ids)
    # decoding writes the meter changes on the downbeats and keeps the tempo
    dec = TOK.decode(ids)
    assert [(t.numerator, t.denominator, t.time // TPQ) for t in dec.time_signature_changes] == [
        (1, 4, 0), (4, 4, 1), (2, 4, 9), (4, 4, 11)]
    assert dec.tempo_changes[0].tempo == pytest.approx(120, rel=0.04)
    assert np.array_equal(TOK.encode(TOK.decode_to_score(ids, "layers").dumps_midi()), ids)


def test_beats_on_a_tempo_change_and_beats_not_on_quarter_notes(tmp_path, midi_factory):
    # the file's tempo doubles at tick 4*480; the beats are half notes of the file (two quarters)
    notes = [(0, False, 60, k * 2 * TPQ, k * 2 * TPQ + TPQ, 90) for k in range(8)]
    mid = midi_factory("tc.mid", notes, tempos=((60.0, 0), (120.0, 4 * TPQ)))
    # seconds of ticks 0, 960, 1920 (60 BPM: 1 s a quarter) then 0.5 s a quarter
    times = [0.0, 2.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    beats = _beats_file(tmp_path / "tc.txt", times, [i % 4 == 0 for i in range(9)])
    ids = TOK.encode(mid, beats=beats)
    bars = _bars(ids)
    assert [b[0] for b in bars] == ["4/4", "4/4"]
    assert bars[0][1] == [0, 12, 24, 36] and bars[1][1] == [0, 12, 24, 36]  # one note per annotated beat
    tempos = [t for t in TOK.ids_to_tokens(ids) if t.startswith("Tempo_")]
    assert len(tempos) == 2  # 30 BPM beats (2 s), then 60 BPM (1 s)
    assert [float(TOK.tempo_values[int(t.split("_")[1])]) for t in tempos] == pytest.approx([30, 60], rel=0.04)


@pytest.mark.parametrize("text, message", [
    ("0.0 0 1\n0.5 1 0\n0.4 0 0\n", "line 3: times not increasing"),
    ("0.0 0 0\n0.5 1 0\n", "no downbeat"),
    ("0.0 0 1 7\n0.5 1 0 7\n", "line 1: unknown beat format"),
    ("0.0 0 1\nzero 1 0\n", "line 2: not a number"),
    ("", "empty beat annotation"),
])
def test_bad_beat_annotations_name_the_file_and_line(tmp_path, text, message):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(MidiError, match=message) as e:
        TOK.encode(_small_midi(tmp_path), beats=path)
    assert "bad.txt" in str(e.value)


def _small_midi(tmp_path):
    from tests.conftest import make_midi

    return make_midi(tmp_path / "small.mid", [(0, False, 60, k * TPQ, k * TPQ + 240, 80) for k in range(8)])


def test_beats_past_the_end_of_the_file_are_refused(tmp_path):
    path = _beats_file(tmp_path / "long.txt", [0.5 * k for k in range(40)], [k % 4 == 0 for k in range(40)])
    with pytest.raises(MidiError, match="past the end"):
        TOK.encode(_small_midi(tmp_path), beats=path)


def test_pop909_with_its_beats_and_chords(shared_data):
    pop = shared_data / "pop909"
    n44 = nbars = 0
    grammar = REMIGrammar(TOK)
    for song in ("001", "002", "050", "300", "777"):
        ids, stats = TOK.encode_with_stats(pop / f"{song}.mid", beats=pop / "beats" / f"{song}.txt",
                                           chords=pop / "chords" / f"{song}.txt")
        assert stats["notes_encoded"] == stats["notes"]
        assert stats["max_onset_error_ticks"] <= TOK.ticks_per_beat_out / TOK.config.beat_resolution / 2
        assert stats["chord_changes"] > 20
        assert grammar.is_valid(ids)
        again = TOK.encode(TOK.decode_to_score(ids, "layers").dumps_midi())  # chords come back as markers
        assert np.array_equal(again, ids)
        bars = _bars(ids)
        nbars += len(bars)
        n44 += sum(b[0] == "4/4" or (b[0] is None) for b in bars)
        # the file's 1/12-beat offset is gone: nearly all onsets are on the 16th grid
        pos = np.array([p for b in bars for p in b[1]])
        assert np.mean(pos % 3 == 0) > 0.85
    assert n44 / nbars > 0.9


def test_chord_labels_and_progressions():
    assert parse_chord("F#:sus4(b7)", harte_only=True) == "F#:sus4"
    assert parse_chord("Bb:min7/b7", harte_only=True) == "A#:min7"
    assert parse_chord("E:hdim7", harte_only=True) == "E:dim"
    assert parse_chord("N") == "N"
    assert parse_chords("C G Am F") == ["C:maj", "G:maj", "A:min", "F:maj"]
    assert parse_chords("Bb7, F#m7 | Csus4 Ebmaj7") == ["A#:7", "F#:min7", "C:sus4", "D#:maj7"]
    with pytest.raises(SpemusicError, match="unknown chord 'Hm'.*m7"):
        parse_chords("C Hm")
    assert len(CHORD_NAMES) == 12 * 9 + 1


def test_transposition_shifts_chord_roots(shared_data, tmp_path):
    pop = shared_data / "pop909"
    cache, _ = prepare(pop, tmp_path / "cache", beats_dir=pop / "beats", chords_dir=pop / "chords", workers=2)
    assert cache.index["annotated"] == {"beats": 809, "chords": 809}
    sampler = WindowSampler(cache, "train", 512)
    window = sampler.window(0, 0)
    out = sampler.transpose(window, np.random.default_rng(3))
    shift = None
    lo, hi = TOK.range("Chord")
    for a, b in zip(window, out):
        if lo <= a < hi - 1:
            ra, rb = TOK.vocab[a].split("_")[1].split(":"), TOK.vocab[b].split("_")[1].split(":")
            assert ra[1] == rb[1]
            d = (CHORD_NAMES.index(f"{rb[0]}:maj") // 9 - CHORD_NAMES.index(f"{ra[0]}:maj") // 9) % 12
            shift = d if shift is None else shift
            assert d == shift
    pitch_lo = TOK.range("Pitch")[0]
    p = np.flatnonzero((window >= pitch_lo) & (window < pitch_lo + 128))
    assert shift == (out[p[0]] - window[p[0]]) % 12


def test_decode_trims_overlaps_unless_asked():
    # a long C4, a second C4 inside it, and a unison doubling of the second (as objects: one MIDI
    # channel cannot hold overlapping notes of one pitch, which is the point)
    mf = miditoolkit.MidiFile(ticks_per_beat=TPQ)
    piano = miditoolkit.Instrument(program=0)
    piano.notes = [miditoolkit.Note(80, 60, 0, 1920), miditoolkit.Note(90, 60, 480, 960), miditoolkit.Note(70, 60, 480, 720)]
    mf.instruments = [piano]
    ids = TOK.encode(mf)
    trimmed = TOK.decode(ids)
    assert len(trimmed.instruments) == 1
    assert [(n.start, n.end) for n in trimmed.instruments[0].notes] == [(0, 480), (480, 960)]
    layered = TOK.decode(ids, overlaps="layers")
    assert len(layered.instruments) == 3 and "layer" in layered.instruments[1].name
    assert np.array_equal(TOK.encode(TOK.decode_to_score(ids, "layers").dumps_midi()), ids)


def test_sampling_forces_one_chord_per_bar(tmp_path):
    import torch

    from spemusic import ModelConfig, Performer
    from spemusic.generation.sampling import sample

    torch.manual_seed(0)
    model = Performer(ModelConfig.preset("tiny", vocab_size=len(TOK), pe="sinespe", gated=True))
    result = sample(model, TOK, num=2, bars=6, seed=1, chords=["C:maj", "G:maj", "A:min", "F:maj"])
    grammar = REMIGrammar(TOK)
    for ids in result.ids:
        assert grammar.is_valid(ids)
        toks = TOK.ids_to_tokens(ids)
        chords = [t for t in toks if t.startswith("Chord_")]
        bars = [i for i, t in enumerate(toks) if t == "Bar"]
        assert len(bars) == 6
        assert chords == ["Chord_C:maj", "Chord_G:maj", "Chord_A:min", "Chord_F:maj", "Chord_C:maj", "Chord_G:maj"]
        for b in bars:  # each bar opens on Position_0 and its chord
            j = b + 1 + toks[b + 1].startswith("TimeSig_")
            assert toks[j] == "Position_0" and toks[j + 1].startswith("Chord_")
        g = note_grid(ids, TOK)
        assert chord_match(g)[1] <= 6


def test_chord_strength_favours_the_bar_chord_tones():
    import torch

    from spemusic import ModelConfig, Performer
    from spemusic.generation.sampling import chord_tones, sample

    tones = chord_tones(TOK, ["C:maj", "N"])
    lo, hi = TOK.range("Pitch")
    on = [int(TOK.vocab[i].split("_")[1]) % 12 for i in range(lo, hi) if tones[0, i]]
    assert set(on) == {0, 4, 7} and tones[1].sum() == 0 and tones[0, :lo].sum() == 0

    torch.manual_seed(0)
    model = Performer(ModelConfig.preset("tiny", vocab_size=len(TOK), pe="sinespe", gated=True))
    progression = ["C:maj", "A:min"]
    share = {}
    for strength in (0.0, 8.0):
        ids = sample(model, TOK, num=2, bars=4, seed=1, chords=progression, chord_strength=strength).ids
        hit = total = 0
        for seq in ids:
            g = note_grid(seq, TOK)
            for b in range(g.n_bars):
                pcs = {0, 4, 7} if b % 2 == 0 else {9, 0, 4}
                bar = g.pitch[g.bar == b] % 12
                hit, total = hit + int(np.isin(bar, list(pcs)).sum()), total + len(bar)
        share[strength] = hit / total
    # a random model plays chord tones about by chance (3 of 12); with the bias, nearly only them
    assert share[0.0] < 0.5 and share[8.0] > 0.9, share


def test_metrics_of_a_steady_four_four_piece(midi_factory):
    # C major triads on every beat of 8 bars of 4/4: no silence, every beat hit, one key, repeats
    notes = [(0, False, p, b * TPQ, (b + 1) * TPQ, 80) for b in range(32) for p in (60, 64, 67)]
    ids = TOK.encode(midi_factory("steady.mid", notes))
    m = summary(ids, TOK)
    assert m["bars_4_4"] == 1.0 and m["silence"] == 0.0 and m["beats_with_onset"] == 1.0
    assert m["repetition"] == 1.0 and m["polyphony"] == 3.0 and m["key_clarity"] > 0.7
    g = note_grid(ids, TOK)
    assert chord_match(g, ["C:maj"] * 8) == (8, 8)
    assert chord_match(g, ["A:min"] * 8) == (0, 8)


def test_cli_beats_and_chords(run_cli, tmp_path, tiny_checkpoint, midi_factory):
    mid = _small_midi(tmp_path)
    bad = tmp_path / "bad.txt"
    bad.write_text("0.0 0 1\n0.5 1 0\n0.4 0 0\n")
    code, _, err = run_cli("tokenize", mid, "--beats", bad, "-o", tmp_path / "x.txt")
    assert code != 0 and "bad.txt line 3: times not increasing" in err and "Traceback" not in err
    assert not (tmp_path / "x.txt").exists()
    good = _beats_file(tmp_path / "good.txt", [0.5 * k for k in range(9)], [k % 4 == 2 for k in range(9)])
    code, _, _ = run_cli("tokenize", mid, "--beats", good, "-o", tmp_path / "x.txt")
    assert code == 0 and (tmp_path / "x.txt").read_text().split()[:3] == ["BOS", "Bar", "TimeSig_2/4"]
    # folder mode: the file whose annotation does not fit is skipped with its reason
    folder, beats = tmp_path / "songs", tmp_path / "beats"
    folder.mkdir(), beats.mkdir()
    for name in ("a", "b", "c"):
        mid.rename(folder / f"{name}.mid") if name == "a" else _small_midi(tmp_path).rename(folder / f"{name}.mid")
    (beats / "a.txt").write_text(good.read_text())
    (beats / "b.txt").write_text(bad.read_text())
    code, out, _ = run_cli("data", "prepare", folder, "-o", tmp_path / "cache", "--beats", beats)
    assert code == 0
    assert "beats: 2 of 2 files annotated" not in out  # b is skipped, c has none
    index = json.loads((tmp_path / "cache" / "index.json").read_text())
    assert [s["path"] for s in index["skipped"]] == ["b.mid"] and "times not increasing" in index["skipped"][0]["reason"]
    assert index["annotated"]["beats"] == 1 and "1 without" in out
    # --chords on a model without chord tokens, and an unknown chord
    code, _, err = run_cli("generate", "-m", tiny_checkpoint, "--bars", "2", "--chords", "C G", "-o", tmp_path / "g.mid")
    assert code != 0 and "no chord tokens" in err and not (tmp_path / "g.mid").exists()
    code, _, err = run_cli("generate", "--bars", "2", "--chords", "C Xm", "-o", tmp_path / "g.mid")
    assert code != 0 and "unknown chord 'Xm'" in err


def test_continue_with_beats_keeps_the_prompt_and_starts_on_the_annotated_downbeat(shared_data, tmp_path, run_cli,
                                                                                   tiny_checkpoint):
    from spemusic.generation.prompts import load_prompt
    from spemusic.tokens.beats import TempoMap

    pop = shared_data / "pop909"
    song, beats = pop / "001.mid", pop / "beats" / "001.txt"
    out = tmp_path / "c.mid"
    code, _, err = run_cli("continue", song, "--beats", beats, "--prompt-bars", "4", "--bars", "2",
                           "-m", tiny_checkpoint, "-o", out)
    assert code == 0, err
    cut = load_prompt(song, REMITokenizer(), 4, beats).cut_tick
    src, res = miditoolkit.MidiFile(str(song)), miditoolkit.MidiFile(str(out))
    # the new bars begin on an annotated downbeat (seconds -> ticks on the file's tempo map)
    tempo = TempoMap(src.ticks_per_beat, [t.time for t in src.tempo_changes], [t.tempo for t in src.tempo_changes])
    down = [float(line.split()[0]) for line in beats.read_text().splitlines() if float(line.split()[2]) == 1]
    assert np.min(np.abs(tempo.ticks(down) - cut)) < 1
    key = lambda n: (n.start, n.end, n.pitch, n.velocity)  # noqa: E731
    before = sorted(key(n) for i in src.instruments for n in i.notes if n.start < cut)
    kept = sorted(key(n) for i in res.instruments for n in i.notes if n.start < cut)
    assert before == kept  # the prompt note for note
    assert any(n.start >= cut for i in res.instruments for n in i.notes)
    # the new bars are marked in their meter from the cut on (the random model may change it there;
    # a fixed seed, through the library, so that the meter it writes is known)
    from spemusic.generation.pieces import continue_prompt
    from spemusic.nn.checkpoint import load_model

    model, tok = load_model(tiny_checkpoint)
    prompt = load_prompt(song, tok, 4, beats)
    piece = continue_prompt(model, tok, prompt, bars=2, seed=1)
    ts_lo, ts_hi = tok.range("TimeSig")
    new_bar = list(piece.ids[0][len(prompt.ids):])
    written = [t for t in new_bar[: new_bar.index(tok.bar_id, 1) if tok.bar_id in new_bar[1:] else None]
               if ts_lo <= t < ts_hi]
    meter = tok.time_signatures[written[0] - ts_lo] if written else (4, 4)  # else the prompt's annotated 4/4
    in_force = [t for t in piece.midis[0].time_signature_changes if t.time <= cut][-1]
    assert (in_force.numerator, in_force.denominator) == tuple(meter)
    # the prompt's bars are the annotated ones (the file itself says 1/4): a 4/4 bar at each of its downbeats
    first = [(t.numerator, t.denominator, t.time) for t in res.time_signature_changes if t.time < cut]
    assert (1, 4) not in {m[:2] for m in first} and (4, 4) in {m[:2] for m in first}
    bars_4_4 = [t.time for t in res.time_signature_changes if t.time < cut and (t.numerator, t.denominator) == (4, 4)]
    assert min(np.min(np.abs(tempo.ticks(down) - t)) for t in bars_4_4) < 1  # at an annotated downbeat


def test_prompt_in_one_beat_bars_is_warned(run_cli, tmp_path, tiny_checkpoint):
    from tests.conftest import make_midi

    mid = make_midi(tmp_path / "q.mid", [(0, False, 60, k * TPQ, k * TPQ + 240, 80) for k in range(8)],
                    time_signatures=((1, 4, 0),))
    code, _, err = run_cli("continue", mid, "--bars", "1", "-m", tiny_checkpoint, "-o", tmp_path / "c.mid")
    assert code == 0 and "one beat long" in err and "--beats" in err
