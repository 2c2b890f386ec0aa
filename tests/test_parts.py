"""Parts (melody, bridge, piano) through the tokenizer, the sampler and `spemusic accompany`."""

from __future__ import annotations

import numpy as np
import pytest
import symusic
from miditoolkit import Instrument, MidiFile, Note, TempoChange, TimeSignature

from spemusic.grammar import REMIGrammar
from spemusic.tokenizer import REMITokenizer, TokenizerConfig

PARTS_TOK = REMITokenizer(TokenizerConfig(chords=True, parts=True))


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
def test_pop909_parts_round_trip(shared_data, song):
    d = shared_data / "pop909"
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


def test_parts_sit_in_the_program_slot_after_the_drums():
    lo, hi = PARTS_TOK.range("Program")
    assert PARTS_TOK.vocab[hi - 4: hi] == ["Program_drums", "Program_melody", "Program_bridge", "Program_piano"]
    assert len(PARTS_TOK) == len(REMITokenizer(TokenizerConfig(chords=True))) + 3
    # configs without parts keep their fingerprint
    assert TokenizerConfig(chords=True).fingerprint() == TokenizerConfig.from_dict(
        TokenizerConfig(chords=True).to_dict()).fingerprint()
    assert "parts" not in TokenizerConfig().to_dict()


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
    from spemusic.accompany import load_melody
    from spemusic.pieces import accompany

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
    from spemusic.accompany import HeldMelody, load_melody
    from spemusic.sampling import sample

    model, tok = load_model("pop-piano")
    late = [(p, s + 16, d, v) for p, s, d, v in MELODY]  # from bar 5
    melody = load_melody(write_tracks(tmp_path / "late.mid", [("MELODY", 0, late)]), tok)
    bar_at = np.flatnonzero(melody.ids == tok.bar_id)
    for bars in (2, 6):
        held = melody.ids[: bar_at[bars]] if bars < len(bar_at) else melody.ids
        ids = sample(model, tok, num=1, bars=bars, seed=5, held=HeldMelody.of(held, tok)).ids[0]
        assert REMIGrammar(tok).is_valid(ids) and np.count_nonzero(ids == tok.bar_id) == bars
        assert melody_notes(ids, tok) == melody_notes(held, tok)


def test_accompany_on_beats_writes_the_annotated_bars(tmp_path):
    """A melody whose file says 1/4 (as POP909's do), accompanied on a beat annotation of 4-beat
    bars: the output's time signatures are the annotation's, so a DAW shows the right bars."""
    from spemusic import load_model
    from spemusic.accompany import load_melody
    from spemusic.pieces import accompany

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
