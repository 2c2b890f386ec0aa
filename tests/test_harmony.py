"""The harmonizer: relative chord tables fitted on bars, the Viterbi chart of a melody, the file
shipped beside pop-piano, and `spemusic accompany` playing its chart."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from spemusic.errors import SpemusicError
from spemusic.music.harmony import N_POS, Harmonizer, accuracy, bars_of, chart_melody, melody_key
from spemusic.tokens.chords import CHORD_NAMES

EXAMPLE = str(Path(__file__).resolve().parents[1] / "data" / "examples" / "melody.mid")


def _bars(chords: list[str], tones: dict[str, list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Bars whose melody plays the chord's tones (a beat each), labelled with the chord."""
    melody = np.zeros((len(chords), 12))
    for b, name in enumerate(chords):
        for pc in tones[name]:
            melody[b, pc] += 1.0
    return melody, np.array([CHORD_NAMES.index(c) for c in chords])


def test_fitted_tables_chart_a_melody_in_any_key(tmp_path):
    from spemusic.music.harmony import BarData

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
    # a chord in every bar, bars without melody too (never N); the chart is the posterior's best
    quiet = np.r_[np.zeros((2, 12)), melody]
    post = h.posterior(quiet)
    assert np.allclose(post.sum(1), 1) and (post[:, -1] == 0).all()
    assert h.chart(quiet)[2:] == song and "N" not in h.chart(quiet)
    # the tables as a file: the same charts
    h.save(tmp_path / "h.json")
    assert Harmonizer.load(tmp_path / "h.json").chart(up) == h.chart(up)
    assert accuracy(h, pieces) == 1.0 and accuracy(h, pieces, triad=True) == 1.0


def test_metrical_positions_weigh_the_beats():
    """A bar's melody by where its notes fall: the same five pitch classes are C major with C, E, G
    on the beats (A and B passing off the beat), A minor with A, C, E on them."""
    from spemusic.music.harmony import BarData

    def bar(on_beats: list[int], off_beats: list[int]) -> np.ndarray:
        m = np.zeros((N_POS, 12))
        for position, pc in zip((0, 1, 3), on_beats):  # beats 1, 2, 3
            m[position, pc] = 1.0
        for pc in off_beats:
            m[2, pc] = 1.0
        return m

    c_bar, a_bar = bar([0, 4, 7], [9, 11]), bar([9, 0, 4], [7, 11])
    assert (c_bar.sum(0) == a_bar.sum(0)).all()
    metric = np.stack([c_bar, a_bar] * 2)
    pieces = [BarData(metric.sum(1), np.array([CHORD_NAMES.index(c) for c in ("C:maj", "A:min") * 2]), metric)
              for _ in range(20)]
    h = Harmonizer.fit(pieces)
    assert h.chart(np.stack([c_bar, a_bar, c_bar])) == ["C:maj", "A:min", "C:maj"]
    assert h.chart(np.stack([a_bar, a_bar, c_bar])) == ["A:min", "A:min", "C:maj"]
    # without their positions the two bars are one histogram, one chart
    assert h.chart(c_bar.sum(0)[None]) == h.chart(a_bar.sum(0)[None])


def test_bars_of_places_notes_by_metrical_position():
    from spemusic import load_model
    from spemusic.generation.accompany import load_melody
    from spemusic.music.metrics import note_grid

    _, tok = load_model("pop-piano")
    ids = load_melody(EXAMPLE, tok).ids
    bars = bars_of(ids, tok)
    assert bars.metric.shape == (len(bars.melody), N_POS, 12)
    # the notes' own bars: the same pitch classes as the beats histogram
    assert ((bars.metric[:, :-1].sum(1) > 0) == (bars.melody > 0)).all()
    g = note_grid(ids, tok)
    mel = g.prog == tok.part_id("melody")
    on_downbeat = mel & (g.pos == 0)
    assert on_downbeat.any() and (bars.metric[g.bar[on_downbeat], 0, g.pitch[on_downbeat] % 12] > 0).all()
    # a note held over the bar line counts in the next bar, last
    held = mel & (g.onset + g.dur > (g.bar_start + g.bar_len)[g.bar]) & (g.bar + 1 < g.n_bars)
    assert (bars.metric[g.bar[held] + 1, -1, g.pitch[held] % 12] > 0).all()


def test_shipped_harmonizer_charts_the_example_melody():
    from spemusic import load_model
    from spemusic.generation.accompany import load_melody

    model, tok = load_model("pop-piano")
    melody = load_melody(EXAMPLE, tok)
    chart = chart_melody(model, melody.ids, tok)
    assert len(chart) == melody.bars == len(bars_of(melody.ids, tok).melody)
    assert set(chart) <= set(CHORD_NAMES) and chart[0] == "C:maj"  # the example is in C major
    assert chart_melody(load_model("groove")[0], melody.ids, tok) is None  # no harmonizer beside it
    # the library plays the chart by default, as the command does
    from spemusic.generation.pieces import accompany

    pieces = accompany(model, tok, melody, seed=3)
    assert pieces.chart == chart
    assert accompany(model, tok, melody, seed=3, harmonize=False).chart is None


def test_a_harmony_file_from_elsewhere_is_one_error(tmp_path):
    bad = tmp_path / "harmony.json"
    for text in ("not json", json.dumps({"format": "other"}),
                 json.dumps({"format": "spemusic-harmony", "qualities": ["maj", "min", "dim", "aug", "sus2", "sus4",
                                                                        "7", "maj7", "min7"],
                             "interval_counts": [[1]], "transition_counts": [], "start_counts": [],
                             "emission_weight": 1}),
                 json.dumps({"format": "spemusic-harmony", "version": 2}),
                 b"\xff\xfe"):
        if isinstance(text, bytes):
            bad.write_bytes(text)
        else:
            bad.write_text(text)
        with pytest.raises(SpemusicError) as e:
            Harmonizer.load(bad)
        assert "\n" not in str(e.value) and str(bad) in str(e.value)
    # a file of the first format (one emission table, no melody positions) says so
    bad.write_text(json.dumps({"format": "spemusic-harmony", "version": 1, "qualities": [], "interval_counts": []}))
    with pytest.raises(SpemusicError, match="version-1 harmony file.*version 2"):
        Harmonizer.load(bad)


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


def test_without_the_harmonizer_the_model_names_the_chords_once_the_melody_plays(tmp_path):
    """--no-harmonize: the bars before the melody's first note (which tell the model nothing of its
    key) take the chart's chords, and the model names every later bar's own, after its melody."""
    import miditoolkit

    from spemusic import load_model
    from spemusic.generation.accompany import load_melody
    from spemusic.generation.pieces import accompany
    from spemusic.music.harmony import melody_chords

    source = miditoolkit.MidiFile(EXAMPLE)
    late = miditoolkit.MidiFile(EXAMPLE)  # the same tune two bars later
    shift = 2 * 4 * source.ticks_per_beat
    for inst in late.instruments:
        for n in inst.notes:
            n.start, n.end = n.start + shift, n.end + shift
    path = tmp_path / "late.mid"
    late.dump(str(path))
    model, tok = load_model("pop-piano")
    melody = load_melody(str(path), tok)
    chart = chart_melody(model, melody.ids, tok)
    chords = melody_chords(model, melody.ids, tok, harmonize=False)
    assert chords == chart[:2] + [None] * (len(chart) - 2)
    assert melody_chords(model, melody.ids, tok) == chart
    assert melody_chords(model, load_melody(EXAMPLE, tok).ids, tok, harmonize=False) is None  # opens the piece
    ids = accompany(model, tok, melody, seed=3, harmonize=False).result.ids[0]
    names = [tok.vocab[int(t)][len("Chord_"):] for t in ids if tok.vocab[int(t)].startswith("Chord_")]
    assert names[:2] == chart[:2]  # (a chord on every bar, and none other in a charted bar)
    from spemusic.cli import app

    r = CliRunner().invoke(app, ["accompany", str(path), "-o", str(tmp_path / "a.mid"), "--seed", "3", "--threads",
                                 "1", "--no-harmonize"])
    said = f"chords charted for the 2 bars before the melody: {' '.join(chart[:2])}; the model names the rest"
    assert r.exit_code == 0 and said in r.output, r.output
