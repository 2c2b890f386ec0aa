"""Parts (melody, bridge, piano) through the tokenizer, the sampler and `spemusic accompany`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import symusic
from miditoolkit import Instrument, MidiFile, Note, TempoChange, TimeSignature

from spemusic.errors import ConfigError
from spemusic.tokens.grammar import REMIGrammar
from spemusic.tokens.tokenizer import CHORD, REPEAT, REMITokenizer, TokenizerConfig

PARTS_TOK = REMITokenizer(TokenizerConfig(chords=True, parts=True))
MELODY_FIRST_TOK = REMITokenizer(TokenizerConfig(chords=True, parts=True, melody_first=True))
BAR_CHORDS_TOK = REMITokenizer(TokenizerConfig(chords=True, parts=True, melody_first=True, chord_every_bar=True))
REPEATS_TOK = REMITokenizer(TokenizerConfig(chords=True, parts=True, melody_first=True, chord_every_bar=True,
                                            repeats=True))
COPIES_TOK = REMITokenizer(TokenizerConfig(chords=True, parts=True, melody_first=True, chord_every_bar=True,
                                           repeats=True, copies=True))


def write_tracks(path, tracks, ticks_per_beat=480):
    """tracks: (name, program, [(pitch, start beat, beats long, velocity)])."""
    mf = MidiFile(ticks_per_beat=ticks_per_beat)
    for name, program, notes in tracks:
        inst = Instrument(program=program, name=name)
        inst.notes = [Note(velocity=v, pitch=p, start=int(s * ticks_per_beat), end=int((s + d) * ticks_per_beat))
                      for p, s, d, v in notes]
        mf.instruments.append(inst)
    mf.tempo_changes = [TempoChange(100.0, 0)]
    mf.time_signature_changes = [TimeSignature(4, 4, 0)]
    mf.dump(str(path))
    return path


MELODY = [(72, 0, 1, 90), (74, 1, 1, 90), (76, 2, 2, 95), (77, 4, 1.5, 90), (76, 5.5, 0.5, 80), (74, 6, 2, 85),
          (72, 8, 1, 90), (71, 9, 1, 88), (72, 10, 2, 92), (67, 12, 4, 80)]


@pytest.mark.parametrize("song", ["001", "123", "456", "809"])
@pytest.mark.parametrize("order", ["time", "melody_first", "chord_every_bar", "repeats"])
def test_pop909_parts_round_trip(shared_data, song, order):
    d = shared_data / "pop909"
    PARTS_TOK = {"time": globals()["PARTS_TOK"], "melody_first": MELODY_FIRST_TOK, "chord_every_bar": BAR_CHORDS_TOK,
                 "repeats": REPEATS_TOK}[order]
    ids = PARTS_TOK.encode(d / f"{song}.mid", beats=d / "beats" / f"{song}.txt", chords=d / "chords" / f"{song}.txt")
    assert REMIGrammar(PARTS_TOK).is_valid(ids)
    score = PARTS_TOK.decode_to_score(ids, overlaps="layers")
    assert np.array_equal(PARTS_TOK.encode(score), ids)  # lossless per part, overlapping notes included
    real = symusic.Score(str(d / f"{song}.mid"))
    counts = {t.name: len(t.notes) for t in real.tracks}
    decoded = {}
    for t in score.tracks:
        part = t.name.split(" (layer ")[0]
        decoded[part] = decoded.get(part, 0) + len(t.notes)
        assert t.program == 0 and not t.is_drum
    assert decoded == {k: v for k, v in counts.items() if v}  # every note back in its own part


def notes_by_track(score) -> dict[str, list]:
    return {t.name: sorted(zip(*(t.notes.numpy()[k].tolist() for k in ("time", "duration", "pitch", "velocity"))))
            for t in score.tracks}


def test_melody_first_writes_each_bars_melody_before_the_other_parts(shared_data):
    """The same notes in both orders; with melody_first every bar is Bar [TimeSig] [Tempo], its
    melody onsets, then the other parts' onsets with the chords (Position restarts)."""
    from spemusic.tokens.grammar import GrammarState
    from spemusic.tokens.tokenizer import CHORD, PITCH, TEMPO

    d = shared_data / "pop909"
    grammar = REMIGrammar(MELODY_FIRST_TOK)
    melody = MELODY_FIRST_TOK.part_id("melody")
    for song in sorted(d.glob("*.mid"))[::8]:
        kw = dict(beats=d / "beats" / f"{song.stem}.txt", chords=d / "chords" / f"{song.stem}.txt")
        ids = MELODY_FIRST_TOK.encode(song, **kw)
        assert grammar.is_valid(ids), song.name
        assert notes_by_track(MELODY_FIRST_TOK.decode_to_score(ids, overlaps="layers")) == \
            notes_by_track(PARTS_TOK.decode_to_score(PARTS_TOK.encode(song, **kw), overlaps="layers"))
        st, restarts = GrammarState(), 0
        for t in ids.tolist():
            kind, before = MELODY_FIRST_TOK.kinds[t], st.in_melody
            grammar.advance(st, t)
            if kind == PITCH:  # the melody's notes in the bar's first sweep, the others' in its second
                assert st.in_melody == (st.note[0] == melody)
            restarts += before and not st.in_melody and st.last == 5  # (a Position at or before the last)
            assert kind != CHORD or not st.in_melody
            assert kind != TEMPO or st.pos == -1
        assert restarts > 0


def test_chord_every_bar_opens_each_bars_other_parts_on_its_chord(shared_data):
    """chord_every_bar: the melody_first stream, plus Position_0 and the chord in force where a
    bar's other parts begin (from the first chord on); the same notes and the same chord changes."""
    from spemusic.tokens.tokenizer import BAR, CHORD, POSITION

    d = shared_data / "pop909"
    grammar = REMIGrammar(BAR_CHORDS_TOK)
    melody, pos0 = BAR_CHORDS_TOK.part_id("melody"), BAR_CHORDS_TOK.range("Position")[0]
    for song in sorted(d.glob("*.mid"))[::40]:
        kw = dict(beats=d / "beats" / f"{song.stem}.txt", chords=d / "chords" / f"{song.stem}.txt")
        ids, plain = BAR_CHORDS_TOK.encode(song, **kw), MELODY_FIRST_TOK.encode(song, **kw)
        assert grammar.is_valid(ids), song.name
        both = [tok.decode_to_score(x, overlaps="layers") for tok, x in ((BAR_CHORDS_TOK, ids), (MELODY_FIRST_TOK, plain))]
        assert notes_by_track(both[0]) == notes_by_track(both[1])
        assert [(m.time, m.text) for m in both[0].markers] == [(m.time, m.text) for m in both[1].markers]
        kinds = BAR_CHORDS_TOK.kinds[ids]
        bars = np.flatnonzero(kinds == BAR)
        first_chord = np.flatnonzero(kinds == CHORD)[0]
        bars_on = bars[bars > first_chord]  # the bars after the first chord's
        for a, b in zip(bars_on, np.r_[bars_on[1:], len(ids) - 1]):
            bar = ids[a:b]
            # the first Position_0 followed by a Chord, after the bar's melody notes alone
            opens = [i for i in range(len(bar) - 1) if bar[i] == pos0 and kinds[a + i + 1] == CHORD]
            assert opens, f"{song.name}: a bar without its chord"
            before = bar[: opens[0]]
            assert not np.isin(before, [p for p in range(*BAR_CHORDS_TOK.range("Program")) if p != melody]).any()
            assert all(kinds[a + i] != POSITION or bar[i + 1] == melody for i in range(opens[0]))


def test_chord_every_bar_needs_melody_first_and_chords():
    with pytest.raises(ConfigError, match="chord_every_bar needs chords and melody_first"):
        TokenizerConfig(chords=True, parts=True, chord_every_bar=True)
    with pytest.raises(ConfigError, match="chord_every_bar needs chords and melody_first"):
        TokenizerConfig(parts=True, melody_first=True, chord_every_bar=True)


def test_melody_first_samples_follow_the_grammar(shared_data):
    """From scratch, on a chord progression and holding a real melody: valid pieces, the asked
    chord opening each bar's other parts, the melody back token for token."""
    from spemusic import load_model
    from spemusic.generation.accompany import hold_melody, load_melody
    from spemusic.generation.sampling import SamplingOptions, sample

    model, shipped = load_model("pop-piano")
    tok = REMITokenizer(TokenizerConfig.from_dict({**shipped.config.to_dict(), "melody_first": True}))
    grammar, opts = REMIGrammar(tok), SamplingOptions.for_model("pop-piano")
    for ids in sample(model, tok, num=2, bars=3, seed=1, options=opts).ids:
        assert grammar.is_valid(ids) and np.count_nonzero(ids == tok.bar_id) == 3
    for ids in sample(model, tok, num=2, bars=3, seed=2, options=opts, chords=["A:min", "F:maj"],
                      chord_strength=1.0).ids:
        assert grammar.is_valid(ids)
        assert [tok.vocab[t] for t in ids if tok.kinds[t] == 11] == ["Chord_A:min", "Chord_F:maj", "Chord_A:min"]
    d = shared_data / "pop909"
    melody = load_melody(d / "001.mid", tok, beats=d / "beats" / "001.txt")
    held = melody.ids[: np.flatnonzero(melody.ids == tok.bar_id)[10]]
    for ids in sample(model, tok, num=2, bars=10, seed=3, options=opts, parts=("melody", "bridge", "piano"),
                      held=hold_melody(held, tok)).ids:
        assert grammar.is_valid(ids) and melody_notes(ids, tok) == melody_notes(held, tok)
        assert len(melody_notes(held, tok)) > 10
    for ids in sample(model, tok, num=2, bars=10, seed=4, options=opts, parts=("melody", "bridge", "piano"),
                      held=hold_melody(held, tok), chords=["B:maj", "C#:maj"], chord_strength=1.0).ids:
        assert grammar.is_valid(ids) and melody_notes(ids, tok) == melody_notes(held, tok)
        assert [tok.vocab[t] for t in ids if tok.kinds[t] == 11] == ["Chord_B:maj", "Chord_C#:maj"] * 5


def test_parts_sit_in_the_program_slot_after_the_drums():
    lo, hi = PARTS_TOK.range("Program")
    assert PARTS_TOK.vocab[hi - 4: hi] == ["Program_drums", "Program_melody", "Program_bridge", "Program_piano"]
    assert len(PARTS_TOK) == len(REMITokenizer(TokenizerConfig(chords=True))) + 3
    # configs without parts keep their fingerprint
    assert TokenizerConfig(chords=True).fingerprint() == TokenizerConfig.from_dict(
        TokenizerConfig(chords=True).to_dict()).fingerprint()
    assert "parts" not in TokenizerConfig().to_dict()
    assert "melody_first" not in TokenizerConfig(parts=True).to_dict()
    assert MELODY_FIRST_TOK.config.fingerprint() != PARTS_TOK.config.fingerprint() and len(MELODY_FIRST_TOK) == len(PARTS_TOK)
    with pytest.raises(ConfigError, match="melody_first needs parts"):
        TokenizerConfig(melody_first=True)


def test_melody_less_file(tmp_path):
    path = write_tracks(tmp_path / "nomelody.mid", [("Bridge", 0, [(67, 0, 1, 70), (69, 1, 1, 70)]),
                                                    ("piano", 0, [(48, 0, 4, 60), (52, 0, 4, 60)])])
    ids = PARTS_TOK.encode(path)
    names = set(PARTS_TOK.ids_to_tokens(ids))
    assert "Program_melody" not in names and {"Program_bridge", "Program_piano"} <= names
    assert [t.name for t in PARTS_TOK.decode_to_score(ids).tracks] == ["BRIDGE", "PIANO"]


def test_five_tracks_of_one_program_are_one_part(tmp_path):
    tracks = [(f"Piano {i}", 0, [(60 + i, i, 1, 80)]) for i in range(5)]
    ids = PARTS_TOK.encode(write_tracks(tmp_path / "five.mid", tracks))
    assert {t for t in PARTS_TOK.ids_to_tokens(ids) if t.startswith("Program")} == {"Program_0"}
    score = PARTS_TOK.decode_to_score(ids)
    assert [(t.name, len(t.notes)) for t in score.tracks] == [("Acoustic Grand Piano", 5)]
    # and a tokenizer without parts reads POP909-named tracks as programs, as before
    named = write_tracks(tmp_path / "named.mid", [("MELODY", 0, MELODY[:2]), ("PIANO", 0, [(48, 0, 2, 60)])])
    plain = REMITokenizer(TokenizerConfig())
    assert {t for t in plain.ids_to_tokens(plain.encode(named)) if t.startswith("Program")} == {"Program_0"}


def melody_notes(ids, tok) -> list[tuple]:
    """(Program, Pitch, Velocity, Duration) of each melody note, in order."""
    seq, melody_id = list(map(int, ids)), tok.part_id("melody")
    return [tuple(seq[i:i + 4]) for i, t in enumerate(seq) if t == melody_id]


def test_accompany_keeps_the_melody_exactly(tmp_path):
    from spemusic import load_model
    from spemusic.generation.accompany import load_melody
    from spemusic.generation.pieces import accompany

    model, tok = load_model("pop-piano")
    path = write_tracks(tmp_path / "tune.mid", [("Lead", 73, MELODY)])
    melody = load_melody(path, tok)
    pieces = accompany(model, tok, melody, num=2, seed=3)
    source = symusic.Score(str(path)).tracks[0].notes.numpy()
    for ids, midi in zip(pieces.ids, pieces.midis):
        assert REMIGrammar(tok).is_valid(ids)
        assert [i.name for i in midi.instruments][0] == "Lead" and midi.instruments[0].program == 73
        kept = midi.instruments[0].notes
        assert [(n.start, n.end, n.pitch, n.velocity) for n in kept] == [
            (int(t), int(t + d), int(p), int(v)) for t, d, p, v in
            zip(source["time"], source["duration"], source["pitch"], source["velocity"])]
        assert {i.name for i in midi.instruments[1:]} <= {"BRIDGE", "PIANO"} and len(midi.instruments) > 1
        # the melody's tokens are the prompt's, token for token
        assert melody_notes(ids, tok) == melody_notes(melody.ids, tok)
        assert len(midi.instruments[0].notes) == len(MELODY)
    model.harmony_file = None  # a model that ships no harmonizer names each bar's chord itself
    alone = accompany(model, tok, melody, seed=3)
    assert alone.chart is None and melody_notes(alone.ids[0], tok) == melody_notes(melody.ids, tok)


def test_accompany_and_parts_errors(run_cli, tmp_path):
    two = write_tracks(tmp_path / "two.mid", [("a", 0, MELODY[:3]), ("b", 0, [(48, 0, 4, 60)])])
    code, _, err = run_cli("accompany", two, "-o", tmp_path / "out.mid")
    assert code != 0 and "none is named MELODY" in err and "--track" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = run_cli("accompany", two, "--track", "zzz", "-o", tmp_path / "out.mid")
    assert code != 0 and "no such track" in err and "Traceback" not in err
    for cmd in (("generate", "--bars", "1", "--parts", "melody,drums"), ("accompany", two, "--parts", "guitar")):
        code, _, err = run_cli(*cmd, "-o", tmp_path / "x.mid")
        assert code != 0 and "unknown part" in err and "melody, bridge, piano" in err and "Traceback" not in err
    code, _, err = run_cli("accompany", two, "--track", "1", "--parts", "melody", "-o", tmp_path / "x.mid")
    assert code != 0 and "the melody is the file's" in err
    code, _, err = run_cli("generate", "--model", "groove", "--bars", "1", "--parts", "piano", "-o", tmp_path / "g.mid")
    assert code != 0 and "has no parts" in err
    assert not any(tmp_path.glob("x*.mid")) and not (tmp_path / "out.mid").exists() and not (tmp_path / "g.mid").exists()


def test_part_programs(run_cli, tmp_path):
    out = tmp_path / "pp.mid"
    code, _, err = run_cli("generate", "--bars", "2", "--seed", "1", "--part-programs", "melody=73,bridge=48", "-o", out)
    assert code == 0, err
    programs = {t.name: t.program for t in symusic.Score(str(out)).tracks}
    assert programs.get("MELODY", 73) == 73 and programs.get("BRIDGE", 48) == 48 and programs.get("PIANO", 0) == 0
    code, _, err = run_cli("generate", "--bars", "1", "--part-programs", "melody=300", "-o", tmp_path / "bad.mid")
    assert code != 0 and "GM program 0-127" in err and not (tmp_path / "bad.mid").exists()


def test_accompany_bars_before_the_melody(tmp_path):
    """Bars before the melody's first note (a song's intro), even a span of them with no melody
    note and so no tempo of its own, are the model's to fill."""
    from spemusic import load_model
    from spemusic.generation.accompany import hold_melody, load_melody
    from spemusic.generation.sampling import sample

    model, tok = load_model("pop-piano")
    late = [(p, s + 16, d, v) for p, s, d, v in MELODY]  # from bar 5
    melody = load_melody(write_tracks(tmp_path / "late.mid", [("MELODY", 0, late)]), tok)
    bar_at = np.flatnonzero(melody.ids == tok.bar_id)
    for bars in (2, 6):
        held = melody.ids[: bar_at[bars]] if bars < len(bar_at) else melody.ids
        ids = sample(model, tok, num=1, bars=bars, seed=5, held=hold_melody(held, tok)).ids[0]
        assert REMIGrammar(tok).is_valid(ids) and np.count_nonzero(ids == tok.bar_id) == bars
        assert melody_notes(ids, tok) == melody_notes(held, tok)


def test_accompany_on_beats_writes_the_annotated_bars(tmp_path):
    """A melody whose file says 1/4 (as POP909's do), accompanied on a beat annotation of 4-beat
    bars: the output's time signatures are the annotation's, so a DAW shows the right bars."""
    from spemusic import load_model
    from spemusic.generation.accompany import load_melody
    from spemusic.generation.pieces import accompany

    model, tok = load_model("pop-piano")
    path = write_tracks(tmp_path / "tune.mid", [("MELODY", 0, MELODY)])
    mf = MidiFile(str(path))
    mf.time_signature_changes = [TimeSignature(1, 4, 0)]
    mf.dump(str(path))
    beat = 0.6  # 100 BPM, as write_tracks writes
    (tmp_path / "beats.txt").write_text("".join(f"{i * beat:.3f} {1 - i % 2} {int(i % 4 == 0)}\n" for i in range(20)))
    melody = load_melody(path, tok, beats=tmp_path / "beats.txt")
    midi = accompany(model, tok, melody, num=1, seed=2).midis[0]
    assert [(t.numerator, t.denominator) for t in midi.time_signature_changes] == [(4, 4)]
    assert [(n.start, n.pitch) for n in midi.instruments[0].notes] == [(int(s * 480), p) for p, s, _, _ in MELODY]


@pytest.mark.parametrize("order", ["time", "melody_first", "repeats"])
def test_lead_sheet_keeps_the_melody_and_the_chords(shared_data, order):
    from spemusic.tokens.tokenizer import CHORD, PROGRAM
    from spemusic.training.data import lead_sheet

    tok = {"time": PARTS_TOK, "melody_first": MELODY_FIRST_TOK, "repeats": REPEATS_TOK}[order]
    d = shared_data / "pop909"
    ids = tok.encode(d / "001.mid", beats=d / "beats" / "001.txt", chords=d / "chords" / "001.txt").astype(np.int64)
    bar_at = np.flatnonzero(ids == tok.bar_id)
    start, bars = bar_at[6], 5
    lead = lead_sheet(ids[start:], tok, bars)
    assert REMIGrammar(tok).is_valid(np.r_[ids[:start], lead])
    cut = np.flatnonzero(lead == tok.bar_id)[bars]
    head, rest = lead[:cut], lead[cut:]
    assert np.array_equal(rest, ids[bar_at[6 + bars]:])  # the bars after it as they were
    original = ids[start: bar_at[6 + bars]]
    programs = head[tok.kinds[head] == PROGRAM]
    assert set(programs.tolist()) == {tok.part_id("melody")}  # only the melody's notes are left
    assert len(programs) == np.count_nonzero(original == tok.part_id("melody"))
    chords = lambda seq: seq[tok.kinds[seq] == CHORD].tolist()  # noqa: E731
    assert chords(head) == chords(original) and chords(head)  # every chord change is kept
    if order == "repeats":  # the melody's marks as they were; the other parts', nothing left to repeat
        marks = lambda seq: seq[tok.kinds[seq] == REPEAT].tolist()  # noqa: E731
        assert marks(head)[0::2] == marks(original)[0::2] and any(marks(original)[1::2])
        assert set(marks(head)[1::2]) == {tok.range("Repeat")[0]}


def test_lead_sheet_option_needs_parts(shared_data, tmp_path):
    from spemusic.errors import OptionError
    from spemusic.options import TrainConfig
    from spemusic.training.data import WindowSampler, prepare

    with pytest.raises(OptionError, match="lead_sheet"):
        TrainConfig(steps=1, lead_sheet=1.5).check()
    midi = tmp_path / "midi"
    midi.mkdir()
    write_tracks(midi / "a.mid", [("PIANO", 0, MELODY)])
    cache, _ = prepare(midi, tmp_path / "cache", TokenizerConfig())
    with pytest.raises(OptionError, match="parts"):
        WindowSampler(cache, "train", 64, lead_sheet=0.5)


def test_melody_clashes_counts_the_melody_time_a_semitone_off_the_accompaniment(tmp_path):
    from spemusic.music.metrics import melody_clashes, note_grid

    chord = [(48, 0, 4, 70), (52, 0, 4, 70), (55, 0, 4, 70)]  # C E G for one bar
    for melody, share in (([(72, 0, 2, 90), (76, 2, 2, 90)], 0.0),        # C, E: chord tones
                          ([(72, 0, 2, 90), (73, 2, 2, 90)], 0.5),        # C, then C# against C
                          ([(66, 0, 4, 90)], 1.0)):                       # F# against G (a semitone)
        path = write_tracks(tmp_path / "m.mid", [("MELODY", 0, melody), ("PIANO", 0, chord)])
        ids = PARTS_TOK.encode(path)
        g = note_grid(ids, PARTS_TOK)
        assert melody_clashes(g, g.prog == PARTS_TOK.part_id("melody")) == pytest.approx(share)


def test_chord_every_bar_samples_state_each_bars_chord():
    """A progression that repeats a chord: with chord_every_bar every bar still states it (the
    grammar allows the repeat there), and the pieces are valid."""
    import torch

    from spemusic import ModelConfig, Performer
    from spemusic.generation.sampling import sample

    torch.manual_seed(0)
    model = Performer(ModelConfig.preset("tiny", vocab_size=len(BAR_CHORDS_TOK), pe="sinespe", gated=True))
    grammar, chord_lo = REMIGrammar(BAR_CHORDS_TOK), BAR_CHORDS_TOK.range("Chord")[0]
    for ids in sample(model, BAR_CHORDS_TOK, num=2, bars=4, seed=5, chords=["A:min", "A:min", "F:maj"],
                      chord_strength=1.0).ids:
        assert grammar.is_valid(ids)
        named = [BAR_CHORDS_TOK.vocab[t] for t in ids if t >= chord_lo and BAR_CHORDS_TOK.kinds[t] == 11]
        assert named == ["Chord_A:min", "Chord_A:min", "Chord_F:maj", "Chord_A:min"]


def test_layout_flags_without_what_they_need_are_one_line_errors(run_cli, tmp_path):
    examples = Path(__file__).resolve().parents[1] / "data" / "examples"
    needs_chords = "--chord-every-bar needs --melody-first and --chords"
    for args, said in ((["--chord-every-bar"], needs_chords), (["--parts", "--melody-first", "--chord-every-bar"], needs_chords),
                       (["--melody-first"], "--melody-first needs --parts"),
                       (["--parts", "--melody-first", "--copies"], "--copies needs --repeats")):
        code, _, err = run_cli("data", "prepare", examples, "-o", tmp_path / "cache", *args)
        assert code != 0 and said in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "cache").exists()
    code, _, err = run_cli("train", examples, "-o", tmp_path / "run", "--chord-every-bar", "--steps", "1")
    assert code != 0 and "--chord-every-bar needs --melody-first and --chords" in err
    assert not (tmp_path / "run").exists()


# Repeat marks (spemusic.tokens.repeats): a phrase of four bars played twice, its piano the same
# but in the sixth bar
PHRASE_PITCHES = (60, 62, 65, 67)
TWICE = [(p + step, 4 * (b + 4 * again) + beat, 1, 90) for again in (0, 1)
         for b, p in enumerate(PHRASE_PITCHES) for beat, step in ((0, 12), (1, 14), (2, 16))]
PIANO_TWICE = [(p + (1 if b == 5 else 0), 4 * b, 4, 60) for b in range(8) for p in (36 + PHRASE_PITCHES[b % 4],)]


def test_repeat_marks_name_the_bar_each_part_repeats(tmp_path):
    """Each bar opens its melody on the mark of the bar it repeats (4 back for the second time
    through the phrase), and its other parts on theirs (none in the sixth bar, whose piano
    changed); the marks come from the notes, so decoding drops them and encoding brings them back."""
    path = write_tracks(tmp_path / "twice.mid", [("MELODY", 0, TWICE), ("PIANO", 0, PIANO_TWICE)])
    ids = REPEATS_TOK.encode(path)
    names = REPEATS_TOK.ids_to_tokens(ids)
    marks = [int(n.removeprefix("Repeat_")) for n in names if n.startswith("Repeat_")]
    assert marks[0::2] == [0, 0, 0, 0, 4, 4, 4, 4] and marks[1::2] == [0, 0, 0, 0, 4, 0, 4, 4]
    bar = names.index("Bar", names.index("Bar") + 1)  # the second bar: Bar, its mark, its melody, its mark, the rest
    assert names[bar:bar + 3] == ["Bar", "Repeat_0", "Position_0"] and names[bar + 2 + 3 * 5] == "Repeat_0"
    grammar = REMIGrammar(REPEATS_TOK)
    assert grammar.is_valid(ids)
    assert grammar.first_violation(np.delete(ids, bar + 1)) == bar + 1  # a bar without its mark is not the language
    four_back = REPEATS_TOK.token_to_id["Repeat_4"]
    assert grammar.first_violation(np.r_[ids[:bar + 1], four_back, ids[bar + 2:]]) == bar + 1  # no bar 4 back yet
    from spemusic.tokens.repeats import unseen_to_none

    window = ids[np.flatnonzero(ids == REPEATS_TOK.bar_id)[2]:]  # from the third bar: bars 5 and 6 name unseen ones
    seen = [REPEATS_TOK.vocab[t] for t in unseen_to_none(window, REPEATS_TOK) if REPEATS_TOK.kinds[t] == REPEAT]
    assert [int(n.removeprefix("Repeat_")) for n in seen] == [0] * 8 + [4, 4, 4, 4]  # (melody, others) a bar
    score = REPEATS_TOK.decode_to_score(ids)
    assert notes_by_track(score) == notes_by_track(BAR_CHORDS_TOK.decode_to_score(BAR_CHORDS_TOK.encode(path)))
    assert np.array_equal(REPEATS_TOK.encode(score), ids)
    assert REPEATS_TOK.vocab[-5:] == [f"Repeat_{lag}" for lag in (0, 1, 2, 4, 8)]
    assert len(REPEATS_TOK) == len(BAR_CHORDS_TOK) + 5  # the other tokens keep their ids
    with pytest.raises(ConfigError, match="repeats needs melody_first"):
        TokenizerConfig(parts=True, repeats=True)


def test_a_repeat_mark_names_only_a_bar_with_notes_in_its_sweep(tmp_path):
    """A mark names a bar to repeat: after a bar of piano alone, the next bar's melody may not be
    marked "1 back" (that bar had no melody), its other parts may."""
    path = write_tracks(tmp_path / "intro.mid", [("MELODY", 0, [(72, 4, 1, 90)]),
                                                 ("PIANO", 0, [(48, 0, 4, 60), (48, 4, 4, 60)])])
    ids = REPEATS_TOK.encode(path)
    marks = np.flatnonzero(REPEATS_TOK.kinds[ids] == REPEAT)[2:]  # the second bar's two marks
    one_back = REPEATS_TOK.token_to_id["Repeat_1"]
    grammar = REMIGrammar(REPEATS_TOK)
    assert grammar.is_valid(ids) and grammar.first_violation(np.r_[ids[:marks[0]], one_back, ids[marks[0] + 1:]]) == marks[0]
    assert grammar.is_valid(np.r_[ids[:marks[1]], one_back, ids[marks[1] + 1:]])


def sweeps_after_marks(ids, tok) -> list[tuple[str, int, tuple]]:
    """(mark name, bar, the sweep's tokens but its velocities) of each mark of `ids`."""
    out, kinds = [], tok.kinds[ids]
    ends = np.flatnonzero(np.isin(kinds, (REPEAT, tok.kinds[tok.bar_id], tok.kinds[tok.eos_id]))).tolist() + [len(ids)]
    for m in np.flatnonzero(kinds == REPEAT).tolist():
        end = next(e for e in ends if e > m)
        out.append((tok.vocab[ids[m]], int(np.count_nonzero(ids[:m] == tok.bar_id)),
                    tuple(int(t) for t in ids[m + 1:end] if tok.vocab[t].split("_")[0] != "Velocity")))
    return out


def test_copy_marks_name_the_sweeps_that_copy_a_bar_exactly_velocities_aside(tmp_path, shared_data):
    """The phrase played twice, its second melody softer: the melody's second time opens on copy
    marks (4 back), and so do the piano's bars but the sixth (changed: no mark);
    decoding drops the marks, encoding writes them again. On real songs every copy mark's sweep
    has exactly its bar's tokens but the velocities, and the grammar takes every file."""
    softer = [(p, s, d, v - 30 if s >= 16 else v) for p, s, d, v in TWICE]
    path = write_tracks(tmp_path / "twice.mid", [("MELODY", 0, softer), ("PIANO", 0, PIANO_TWICE)])
    ids = COPIES_TOK.encode(path)
    marks = [name for name, _, _ in sweeps_after_marks(ids, COPIES_TOK)]
    assert marks[0::2] == ["Repeat_0"] * 4 + ["Repeat_copy4"] * 4
    assert marks[1::2] == ["Repeat_0"] * 4 + ["Repeat_copy4", "Repeat_0", "Repeat_copy4", "Repeat_copy4"]
    assert np.array_equal(COPIES_TOK.encode(COPIES_TOK.decode_to_score(ids)), ids)
    assert COPIES_TOK.vocab[-4:] == [f"Repeat_copy{lag}" for lag in (1, 2, 4, 8)]
    assert len(COPIES_TOK) == len(REPEATS_TOK) + 4  # the other tokens keep their ids
    with pytest.raises(ConfigError, match="copies needs repeats"):
        TokenizerConfig(parts=True, melody_first=True, copies=True)
    from spemusic.tokens.beats import read_beats
    from spemusic.tokens.chords import read_chords

    grammar, copies = REMIGrammar(COPIES_TOK), 0
    for song in ("001", "123", "456", "809"):
        ids = COPIES_TOK.encode(shared_data / f"pop909/{song}.mid", beats=read_beats(shared_data / f"pop909/beats/{song}.txt"),
                                chords=read_chords(shared_data / f"pop909/chords/{song}.txt"))
        assert grammar.is_valid(ids)
        sweeps = sweeps_after_marks(ids, COPIES_TOK)
        by_place = {(bar, i % 2): tokens for i, (_, bar, tokens) in enumerate(sweeps)}
        for i, (name, bar, tokens) in enumerate(sweeps):
            if "copy" in name:
                copies += 1
                assert tokens and by_place[bar - int(name.removeprefix("Repeat_copy")), i % 2] == tokens
    assert copies > 50


def test_a_copy_mark_is_followed_by_its_bar_written_again():
    """Sampling under the grammar (random odds, copy marks favoured): after a copy mark the
    sampler writes the sweep it names again, velocities its own, then ends the sweep; where the
    allowed tokens lack the copy's next one (a part left out), the copy gives way and ends."""
    from spemusic.tokens.grammar import GrammarState

    tok, grammar, rng = COPIES_TOK, REMIGrammar(COPIES_TOK), np.random.default_rng(0)
    bias = np.zeros(len(tok))
    bias[tok.range("Repeat")[0] + 5:] = 4.0  # the copy marks
    bias[tok.bar_id] = -2.0  # bars of a few notes
    st, ids = GrammarState(), []
    while ids.count(tok.bar_id) < 40:
        mask = grammar.allowed(st, allow_eos=False)
        grammar.follow_copy(st, mask)
        logits = np.where(mask, rng.normal(size=len(tok)) + bias, -np.inf)
        ids.append(int(np.argmax(logits)))
        grammar.advance(st, ids[-1])
    ids = np.array(ids[:len(ids) - 1] + [tok.eos_id])
    assert grammar.is_valid(ids)
    sweeps = sweeps_after_marks(ids, tok)
    by_place = {(bar, i % 2): tokens for i, (_, bar, tokens) in enumerate(sweeps)}
    copied = [(name, bar, i % 2, tokens) for i, (name, bar, tokens) in enumerate(sweeps) if "copy" in name]
    assert len(copied) > 10 and {side for *_, side, _ in copied} == {0, 1}
    for name, bar, side, tokens in copied:
        assert tokens == by_place[bar - int(name.removeprefix("Repeat_copy")), side]
    velocities = {}
    for t, nxt in zip(ids[:-1], ids[1:]):
        velocities.setdefault(tok.vocab[t], set()).add(int(nxt)) if tok.kinds[nxt] == tok.kinds[tok._vel_first] else None
    assert any(len(v) > 1 for v in velocities.values())  # the copies' velocities are drawn, not copied
    # a copy the allowed tokens cannot follow gives way: the mask stays, and the copy ends
    st = GrammarState()
    for t in ids[:np.flatnonzero([tok.vocab[t].startswith("Repeat_copy") for t in ids])[0] + 1]:
        grammar.advance(st, int(t))
    mask = grammar.allowed(st, allow_eos=False)
    mask[st.copy[0]] = False
    kept = mask.copy()
    grammar.follow_copy(st, mask)
    assert np.array_equal(mask, kept) and st.copy is not None
    grammar.advance(st, int(np.flatnonzero(mask)[0]))
    assert st.copy is None


def test_a_like_bar_names_what_its_bar_wrote_at_each_place_and_the_sampler_keeps_to_it(tmp_path):
    """The phrase played twice, its second time with each bar's last note held a beat longer:
    each of those melody sweeps is marked like the bar 4 back (not a copy). Along it, the grammar
    names the token that bar wrote at each place (its shorter duration where this one is longer:
    the places stay aligned), no velocity, and the sweep's end once its notes are done. The
    sampler adds its nats there and nowhere else."""
    from spemusic.generation.sampling import follow_like_bars
    from spemusic.tokens.chords import read_chords
    from spemusic.tokens.grammar import GrammarState

    varied = [(p, s, d + (1 if s % 4 == 2 and s >= 16 else 0), v) for p, s, d, v in TWICE]
    ids = COPIES_TOK.encode(write_tracks(tmp_path / "varied.mid", [("MELODY", 0, varied), ("PIANO", 0, PIANO_TWICE)]))
    tok, grammar, kinds = COPIES_TOK, REMIGrammar(COPIES_TOK), COPIES_TOK.kinds
    sweeps = sweeps_after_marks(ids, tok)
    assert [name for name, *_ in sweeps[0::2]] == ["Repeat_0"] * 4 + ["Repeat_4"] * 4
    st, checked, longer = GrammarState(), 0, 0
    for i, t in enumerate(ids[:-1]):
        grammar.advance(st, int(t))
        want = grammar.like_bar(st)
        if st.like is None or st.marks != 1:
            assert want is None or st.marks == 2  # (the piano's own marks: like or copy)
            continue
        nxt = int(ids[i + 1])
        if kinds[nxt] == kinds[tok._vel_first]:
            assert want is None
        elif kinds[nxt] == REPEAT:  # the melody's sweep is done: any mark ends it
            assert want.sum() == len(tok.mark_lags) and want[nxt]
        elif want.sum() == 1 and not want[nxt]:  # the held note: the bar 4 back's is a beat shorter
            named = int(np.flatnonzero(want)[0])
            assert kinds[nxt] == kinds[named] == kinds[tok._dur_first] and named < nxt
            longer += 1
        else:
            assert want.sum() == 1 and want[nxt]
        checked += 1
    assert checked > 40 and longer == 4
    # the piano's bar 6 held longer: like the bar 4 back; under another chord it is no longer held
    piano = [(p, s, d + (2 if s == 24 else 0), v) for p, s, d, v in PIANO_TWICE]
    (tmp_path / "c.txt").write_text("0.0 16.0 C:maj\n")  # (120 bpm: all 8 bars)
    ids = tok.encode(write_tracks(tmp_path / "piano.mid", [("MELODY", 0, TWICE), ("PIANO", 0, piano)]),
                     chords=read_chords(tmp_path / "c.txt"))
    mark = np.flatnonzero(kinds[ids] == REPEAT)[2 * 6 + 1]
    assert tok.vocab[ids[mark]] == "Repeat_4" and tok.vocab[ids[mark + 2]].startswith("Chord_")
    for chord, held in ((tok.token_to_id["Chord_F#:maj"], False), (int(ids[mark + 2]), True)):
        st = GrammarState()
        for t in [*ids[:mark + 2], chord]:
            grammar.advance(st, int(t))
        assert (st.like is not None) == held
    # (held: the bar 4 back's next token is its piano note's Program)
    logits = np.where(grammar.allowed(st, allow_eos=False), 0.0, -np.inf).astype(np.float32)[None]
    held = follow_like_bars(logits, [st], grammar, 3.0)
    assert np.isneginf(held[np.isneginf(logits)]).all() and np.array_equal(follow_like_bars(logits, [st], grammar, 0.0), logits)
    assert np.flatnonzero(held[0] != logits[0]).tolist() == [int(ids[mark + 3])] and held[0, ids[mark + 3]] == 3.0


def test_a_sampled_like_bar_keeps_to_its_bar_with_follow_repeats(monkeypatch):
    """A random model's like-bar marks (no copy marks in its vocabulary): with --follow-repeats
    far more of its bars repeat an earlier one (its pieces re-tokenized: each mark is read off
    the notes) than its own odds draw."""
    from spemusic.generation.sampling import SamplingOptions, sample

    monkeypatch.setenv("SPEMUSIC_COMPILE", "0")
    model, tok, grammar = _tiny_marked_model(), REPEATS_TOK, REMIGrammar(REPEATS_TOK)

    def repeats(nats: float) -> int:
        opts = SamplingOptions(bar_top_p=0.8, onset_top_p=0.9, follow_repeats=nats)
        pieces = sample(model, tok, num=2, bars=12, seed=3, options=opts).ids
        assert all(grammar.is_valid(ids) for ids in pieces)
        return sum(name != "Repeat_0" for ids in pieces for name, *_ in sweeps_after_marks(ids, tok))

    assert repeats(20.0) > 2 * repeats(0.0) + 2


def _tiny_marked_model(tok=REPEATS_TOK):
    """A random tiny model over `tok` with the bar echo, the echo head and the marks."""
    import torch

    from spemusic.nn.model import ModelConfig, Performer
    from spemusic.training.train import bar_echo_config, echo_head_config, repeat_marks_config

    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=len(tok), **bar_echo_config(tok, 4),
                             **echo_head_config(True, tok), repeat_marks=repeat_marks_config(tok))
    return Performer(cfg).eval()


def test_sampled_and_played_pieces_write_the_copies_their_marks_name(monkeypatch):
    """A random model's copy marks are written out as copies: its pieces (re-tokenized, so every
    copy mark there is read off the notes) hold exact copies, which its own odds would never draw."""
    from spemusic.generation.sampling import SamplingOptions, sample, stream_bars

    monkeypatch.setenv("SPEMUSIC_COMPILE", "0")  # (the eager step: no compile for one more tiny shape)
    model, tok, grammar = _tiny_marked_model(COPIES_TOK), COPIES_TOK, REMIGrammar(COPIES_TOK)
    opts = SamplingOptions(bar_top_p=0.8, onset_top_p=0.9, hole_penalty=4.0, stacking=0.8)
    pieces = sample(model, tok, num=2, bars=8, seed=1, options=opts).ids
    bars = stream_bars(model, tok, options=opts, seed=1)
    played = np.array([tok.bos_id, *[t for _ in range(8) for t in next(bars)], tok.eos_id])
    for ids in [*pieces, tok.encode(tok.decode_to_score(played))]:
        assert grammar.is_valid(ids)
        assert any(tok.vocab[t].startswith("Repeat_copy") and len(sweep) > 4
                   for t, (_, _, sweep) in zip(ids[tok.kinds[ids] == REPEAT], sweeps_after_marks(ids, tok)))


def test_pieces_with_repeat_marks_follow_the_grammar_and_accompany_holds_the_melody_and_its_marks(tmp_path):
    from spemusic.generation.accompany import hold_melody, load_melody
    from spemusic.generation.sampling import SamplingOptions, sample

    model, tok, grammar = _tiny_marked_model(), REPEATS_TOK, REMIGrammar(REPEATS_TOK)
    opts = SamplingOptions(bar_top_p=0.8, onset_top_p=0.9, hole_penalty=4.0, stacking=0.8)
    for ids in sample(model, tok, num=2, bars=3, seed=1, options=opts).ids:
        assert grammar.is_valid(ids) and np.count_nonzero(ids == tok.bar_id) == 3
        assert np.count_nonzero(tok.kinds[ids] == REPEAT) == 6
    for ids in sample(model, tok, num=2, bars=3, seed=5, options=opts, parts=("bridge", "piano")).ids:
        assert grammar.is_valid(ids) and tok.part_id("melody") not in ids  # no melody: its sweeps stay empty
    melody = load_melody(write_tracks(tmp_path / "tune.mid", [("Lead", 0, TWICE)]), tok)
    for ids in sample(model, tok, num=2, bars=10, seed=6, options=opts, held=hold_melody(melody.ids, tok)).ids:
        assert grammar.is_valid(ids) and melody_notes(ids, tok) == melody_notes(melody.ids, tok)  # bars past it
    held_marks = [t for t in melody.ids[tok.kinds[melody.ids] == REPEAT]][0::2]
    for chords in (None, ["A:min", "F:maj"]):
        for ids in sample(model, tok, num=2, bars=8, seed=2, options=opts, held=hold_melody(melody.ids, tok),
                          chords=chords, chord_strength=1.0).ids:
            assert grammar.is_valid(ids) and melody_notes(ids, tok) == melody_notes(melody.ids, tok)
            assert [t for t in ids[tok.kinds[ids] == REPEAT]][0::2] == held_marks  # the melody's marks, as held
            if chords:
                assert [tok.vocab[t] for t in ids if tok.kinds[t] == CHORD][:2] == ["Chord_A:min", "Chord_F:maj"]


def test_part_summary_reads_the_songs_form_where_the_melody_enters_and_how_it_keeps_on(tmp_path):
    from spemusic.music.metrics import part_summary

    chords = [(p, 4 * b, 4, 70) for b in range(8) for p in (48, 52, 55)]  # a C chord in each of 8 bars
    melody = [(72, 4 * b, 2, 90) for b in (3, 4, 6, 7)]  # enters in bar 3 (from 0), rests in bar 5
    path = write_tracks(tmp_path / "m.mid", [("MELODY", 0, melody), ("PIANO", 0, chords)])
    out = part_summary(PARTS_TOK.encode(path), PARTS_TOK)
    assert out["melody_entry"] == 3 and out["melody_kept"] == pytest.approx(4 / 5)
    assert out["opening_notes_per_bar"] == pytest.approx((4 * 3 + 1) / 4)
    assert out["melody_out_of_key"] == 0 and out["accompaniment_out_of_key"] == 0  # C major, all of it
    sharp = write_tracks(tmp_path / "s.mid", [("MELODY", 0, [*melody[:3], (73, 28, 2, 90)]), ("PIANO", 0, chords)])
    out = part_summary(PARTS_TOK.encode(sharp), PARTS_TOK)
    assert out["melody_out_of_key"] == pytest.approx(1 / 4) and out["accompaniment_out_of_key"] == 0  # a C#
    alone = write_tracks(tmp_path / "p.mid", [("PIANO", 0, chords)])
    out = part_summary(PARTS_TOK.encode(alone), PARTS_TOK)
    assert out["melody_entry"] == 8 and np.isnan(out["melody_kept"])
