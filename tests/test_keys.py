"""--key: key names, the key of a piece, and transposing token sequences."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spemusic.errors import SpemusicError
from spemusic.music.keys import estimate_key, key_name, parse_key, shift_to, transpose_ids
from spemusic.tokens.tokenizer import REMITokenizer, TokenizerConfig

TOK = REMITokenizer(TokenizerConfig(chords=True))


@pytest.mark.parametrize("text,key", [("A minor", (9, "minor")), ("Am", (9, "minor")), ("F# major", (6, "major")),
                                      ("Bb", (10, "major")), ("c# min", (1, "minor")), ("Db", (1, "major"))])
def test_parse_key(text, key):
    assert parse_key(text) == key


def test_bad_key_is_an_error():
    with pytest.raises(SpemusicError, match="'A minor'"):
        parse_key("H dorian")


def test_shift_to_keeps_the_mode_and_reads_relatives():
    assert shift_to((0, "major"), (7, "major")) == -5  # C -> G: the nearer way, down a fourth
    assert shift_to((0, "major"), (9, "minor")) == 0  # C major is A minor's relative
    assert shift_to((8, "major"), (9, "minor")) == 4  # Ab major = F minor -> A minor
    assert shift_to((9, "minor"), (2, "major")) == 2  # A minor = C major -> D major


def _phrase(pitches, chord=None, drum=False):
    toks = ["Bar", "TimeSig_4/4", "Position_0"] + ([f"Chord_{chord}"] if chord else []) + ["Tempo_10"]
    for p in pitches:
        toks += ["Program_drums" if drum else "Program_0", f"Pitch_{p}", "Velocity_20"] + ([] if drum else ["Duration_12"])
    return TOK.tokens_to_ids(["BOS", *toks, "EOS"])


def test_transpose_moves_pitches_and_chord_roots_not_drums():
    ids = _phrase([57, 60, 64], chord="A:min")
    out = transpose_ids(ids, TOK, 2)
    assert TOK.ids_to_tokens(out)[4] == "Chord_B:min"
    assert [t for t in TOK.ids_to_tokens(out) if t.startswith("Pitch")] == ["Pitch_59", "Pitch_62", "Pitch_66"]
    drums = _phrase([36, 38], drum=True)
    assert np.array_equal(transpose_ids(drums, TOK, 5), drums)
    top = transpose_ids(_phrase([126]), TOK, 3)  # would leave the MIDI range: an octave lower instead
    assert "Pitch_117" in TOK.ids_to_tokens(top)


def test_estimate_key_of_a_c_major_scale():
    tonic, mode, corr = estimate_key(_phrase([60, 62, 64, 65, 67, 69, 71, 72, 60, 64, 67]), TOK)
    assert key_name(tonic, mode) == "C major" and corr > 0.7


def test_generate_key(run_cli, tiny_checkpoint, tmp_path):
    out = tmp_path / "k.mid"
    code, stdout, err = run_cli("generate", "--model", tiny_checkpoint, "--bars", 4, "--seed", 1, "--key", "D major",
                                "--json", "-o", out)
    assert code == 0, err
    assert "found in" in err and "D major" in err
    tonic, mode, _ = estimate_key(REMITokenizer().encode(out), REMITokenizer())
    assert (tonic, mode) in ((2, "major"), (11, "minor"))  # D major, or its relative B minor
    assert json.loads(stdout)["file"] == str(out)
    code, _, err = run_cli("generate", "--model", tiny_checkpoint, "--bars", 4, "--key", "Am", "--chords", "Am F C G",
                           "-o", tmp_path / "x.mid")
    assert code == 1 and "give one" in err
    code, _, err = run_cli("generate", "--model", tiny_checkpoint, "--bars", 4, "--key", "X", "-o", tmp_path / "y.mid")
    assert code == 1 and "--key 'X'" in err and not (tmp_path / "y.mid").exists()
