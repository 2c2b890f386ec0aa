"""The models shipped in checkpoints/: they load, make valid music with no data, pick the right
model for a prompt, and their cards' figures are what `spemusic eval` measures."""

from __future__ import annotations

import json
import re

import miditoolkit
import pytest

from spemusic.nn.checkpoint import available_models, load_model
from spemusic.tokens.grammar import REMIGrammar
from spemusic.tokens.tokenizer import REMITokenizer


def test_both_models_are_installed(run_cli):
    models = available_models()
    assert {"pop-piano", "groove"} <= set(models)
    for name in ("pop-piano", "groove"):
        assert (models[name] / "model.safetensors").stat().st_size <= 25 * 2**20
        assert (models[name] / "README.md").is_file()
        model, tok = load_model(name)
        assert model.cfg.pe == "sinespe" and model.cfg.gated
    code, out, _ = run_cli("models")
    assert code == 0 and "pop-piano" in out and "groove" in out and "sinespe gated" in out


def test_generate_4096_with_the_default_model(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli("generate", "--length", 4096, "-o", "x.mid", "--json")
    assert code == 0, err
    record = json.loads(out.strip().splitlines()[-1])
    assert record["notes"] > 100 and record["bars"] > 8
    tok = REMITokenizer()
    ids = tok.encode(tmp_path / "x.mid")
    assert REMIGrammar(tok).is_valid(ids)
    midi = miditoolkit.MidiFile(str(tmp_path / "x.mid"))
    assert not any(i.is_drum for i in midi.instruments)


def test_continue_a_drum_prompt_with_drums(run_cli, examples, tmp_path):
    out = tmp_path / "more.mid"
    code, _, err = run_cli("continue", examples["groove"], "--bars", 4, "-o", out, "--seed", 3)
    assert code == 0, err
    src = miditoolkit.MidiFile(str(examples["groove"]))
    got = miditoolkit.MidiFile(str(out))
    assert all(i.is_drum for i in got.instruments), "a drum prompt must be continued by the groove model"
    before = {(n.start, n.pitch) for i in src.instruments for n in i.notes}
    after = {(n.start, n.pitch) for i in got.instruments for n in i.notes}
    assert before < after and max(s for s, _ in after) >= 2 * 4 * src.ticks_per_beat


@pytest.mark.parametrize("name,data", [("pop-piano", "pop909"), ("groove", "groove")])
def test_model_card_nll_is_reproduced_by_eval(run_cli, shared_data, tmp_path, name, data):
    card = (available_models()[name] / "README.md").read_text()
    match = re.search(r"spemusic eval \S+ \S+ --max-len (\d+)((?: --(?:beats|chords) \S+)*)", card)
    figure = re.search(r"\*\*valid NLL, `spemusic eval`, positions 0–\d+\*\* \| \*\*([0-9.]+)\*\*", card)
    assert match and figure, "the card gives its eval command and figure"
    # the card's annotation folders (--beats ../shared/data/pop909/beats ...), read from this checkout's data
    extra = [a.replace("../shared/data", str(shared_data)) for a in match.group(2).split()]
    code, out, err = run_cli("eval", name, shared_data / data, "--max-len", match.group(1), *extra,
                             "--json", tmp_path / "e.json")
    assert code == 0, err
    measured = json.loads((tmp_path / "e.json").read_text())["mean_nll"]
    assert measured == pytest.approx(float(figure.group(1)), rel=0.01)


def test_continue_says_which_instruments_of_the_prompt_stop(run_cli, midi_factory, tmp_path):
    piano = [(0, False, 60 + i % 5, i * 480, i * 480 + 400, 80) for i in range(16)]
    bass = [(33, False, 36, i * 960, i * 960 + 800, 90) for i in range(8)]
    drums = [(0, True, 36, i * 480, i * 480 + 60, 100) for i in range(16)]
    band = midi_factory("band.mid", piano + bass + drums)
    code, _, err = run_cli("continue", band, "--model", "pop-piano", "--bars", 2, "--seed", 1,
                           "-o", tmp_path / "more.mid")
    assert code == 0, err
    flat = " ".join(err.split())
    # pop-piano writes its parts (melody, bridge, piano), not the prompt's GM programs
    said = flat.split("the model did not continue ")[1].split(" of the prompt")[0]
    assert "Electric Bass (finger)" in said and "drums" in said, err
    assert "the new bars play" in flat and "piano" in flat.split("the new bars play")[1], err
