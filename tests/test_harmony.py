"""The harmonizer: relative chord tables fitted on bars, the Viterbi chart of a melody, the file
shipped beside pop-piano, and `spemusic accompany` playing its chart."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from spemusic.chords import CHORD_NAMES
from spemusic.errors import SpemusicError
from spemusic.harmony import Harmonizer, bars_of, chart_melody, melody_key

EXAMPLE = str(Path(__file__).resolve().parents[1] / "data" / "examples" / "melody.mid")


def _bars(chords: list[str], tones: dict[str, list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Bars whose melody plays the chord's tones (a beat each), labelled with the chord."""
    melody = np.zeros((len(chords), 12))
    for b, name in enumerate(chords):
        for pc in tones[name]:
            melody[b, pc] += 1.0
    return melody, np.array([CHORD_NAMES.index(c) for c in chords])


def test_fitted_tables_chart_a_melody_in_any_key():
    from spemusic.harmony import BarData

    tones = {"C:maj": [0, 4, 7, 0], "F:maj": [5, 9, 0, 5], "G:maj": [7, 11, 2, 7], "A:min": [9, 0, 4, 9]}
    song = ["C:maj", "F:maj", "G:maj", "C:maj", "A:min", "F:maj", "G:maj", "C:maj"]
    pieces = [BarData(*_bars(song, tones)) for _ in range(20)]
    h = Harmonizer.fit(pieces)
    melody, _ = _bars(song, tones)
    assert h.chart(melody) == song
    # the tables are relative: the same song a tone up is charted a tone up
    up = np.roll(melody, 2, axis=1)
    assert h.chart(up) == ["D:maj", "G:maj", "A:maj", "D:maj", "B:min", "G:maj", "A:maj", "D:maj"]
    assert melody_key(melody) == (0, 0) and melody_key(up) == (2, 0)
    assert h.chart(np.zeros((0, 12))) == []


def test_shipped_harmonizer_charts_the_example_melody():
    from spemusic import load_model
    from spemusic.accompany import load_melody

    model, tok = load_model("pop-piano")
    melody = load_melody(EXAMPLE, tok)
    chart = chart_melody(model, melody.ids, tok)
    assert len(chart) == melody.bars == len(bars_of(melody.ids, tok).melody)
    assert set(chart) <= set(CHORD_NAMES) and chart[0] == "C:maj"  # the example is in C major
    assert chart_melody(load_model("groove")[0], melody.ids, tok) is None  # no harmonizer beside it
    # the library plays the chart by default, as the command does
    from spemusic.pieces import accompany

    pieces = accompany(model, tok, melody, seed=3)
    assert pieces.chart == chart
    assert accompany(model, tok, melody, seed=3, harmonize=False).chart is None


def test_a_harmony_file_from_elsewhere_is_one_error(tmp_path):
    bad = tmp_path / "harmony.json"
    for text in ("not json", json.dumps({"format": "other"}),
                 json.dumps({"format": "spemusic-harmony", "qualities": ["maj", "min", "dim", "aug", "sus2", "sus4",
                                                                        "7", "maj7", "min7"],
                             "interval_counts": [[1]], "transition_counts": [], "start_counts": [],
                             "emission_weight": 1})):
        bad.write_text(text)
        with pytest.raises(SpemusicError) as e:
            Harmonizer.load(bad)
        assert "\n" not in str(e.value)


def test_accompany_plays_the_chart_and_names_it(tmp_path):
    import symusic

    from spemusic.cli import app

    runner = CliRunner()
    out = tmp_path / "a.mid"
    r = runner.invoke(app, ["accompany", EXAMPLE, "-o", str(out), "--seed", "3", "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert "chords (charted from the melody, one per bar): C:maj" in r.output
    charted = r.output.split("one per bar): ")[1].split("\n")[0].split()
    marks = [m.text for m in symusic.Score(str(out)).markers]
    changes = [c for i, c in enumerate(charted) if i == 0 or c != charted[i - 1]]
    assert marks == changes  # the chart, as chord markers at its changes
    r = runner.invoke(app, ["accompany", EXAMPLE, "-o", str(tmp_path / "b.mid"), "--seed", "3", "--threads", "1",
                            "--no-harmonize"])
    assert r.exit_code == 0 and "charted" not in r.output
