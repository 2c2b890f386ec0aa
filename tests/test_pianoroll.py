"""`spemusic show` and `--png`: piano-roll pictures."""

from __future__ import annotations

import numpy as np
import pytest
import symusic

pytest.importorskip("matplotlib")
from matplotlib.image import imread

from spemusic.music.pianoroll import CONTINUATION_MARKER, bar_grid

CHORD = [(0, False, p, 0, 960, 90) for p in (60, 64, 67)]


def test_show_writes_an_image_of_the_asked_size_that_follows_the_notes(run_cli, midi_factory, tmp_path):
    low = midi_factory("low.mid", CHORD + [(0, False, 48, 960, 1920, 60)])
    high = midi_factory("high.mid", CHORD + [(0, False, 72, 960, 1920, 60)])
    images = []
    for src in (low, high):
        out = tmp_path / f"{src.stem}.png"
        code, _, err = run_cli("show", src, "-o", out, "--size", "800x400")
        assert code == 0, err
        img = imread(out)
        assert img.shape[:2] == (400, 800)
        images.append(img)
    assert np.abs(images[0] - images[1]).sum() > 100  # a different note, a different picture
    again = tmp_path / "again.png"
    run_cli("show", low, "-o", again, "--size", "800x400")
    assert np.array_equal(imread(again), images[0])  # and the same notes the same one


def test_show_formats_bars_and_drums(run_cli, examples, tmp_path):
    for suffix, head in ((".svg", b"<?xml"), (".pdf", b"%PDF")):
        out = tmp_path / f"groove{suffix}"
        code, _, err = run_cli("show", examples["groove"], "-o", out)
        assert code == 0, err
        assert out.read_bytes().startswith(head)
    code, _, err = run_cli("show", examples["piano"], "--bars", "2:3", "-o", tmp_path / "part.png")
    assert code == 0, err
    code, _, err = run_cli("show", examples["piano"], "--bars", "40:", "-o", tmp_path / "none.png")
    assert code == 1 and "the file has" in err and not (tmp_path / "none.png").exists()


def test_show_folder_mode(run_cli, examples, tmp_path):
    code, _, err = run_cli("show", examples["groove"].parent, "-o", tmp_path / "rolls/")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "rolls").iterdir()) == ["groove.png", "piano.png"]


@pytest.mark.parametrize("args,message", [
    (["--size", "huge"], "WIDTHxHEIGHT"),
    (["--bars", "3:1"], "must not come before"),
    (["--format", "gif"], "png, svg or pdf"),
    (["-o", "roll.gif"], "cannot draw a .gif"),
])
def test_show_bad_options(run_cli, examples, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("show", examples["piano"], *args)
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir())


def test_bar_range_errors_name_the_parameter_and_show_the_flag(run_cli, examples, tmp_path):
    from spemusic.errors import OptionError
    from spemusic.music.pianoroll import draw_file, parse_bar_range, parse_size

    for call, text in ((lambda: parse_bar_range("{a}"), "bars '{a}': give A:B"),
                       (lambda: parse_size("10x10"), "size '10x10': width 200-20000"),
                       (lambda: draw_file(examples["piano"], tmp_path / "p.png", (99, 0)),
                        f"{examples['piano']}: bars 99:4: the file has 4 bars")):
        with pytest.raises(OptionError) as e:
            call()
        assert str(e.value).startswith(text) and "--" not in str(e.value), str(e.value)
    # a file of a folder that has too few bars is skipped, with the flag
    code, _, err = run_cli("show", examples["piano"].parent, "--bars", "3:", "-o", tmp_path / "rolls/")
    assert code == 0 and f"skipped: {examples['groove']}: --bars 3:2: the file has 2 bars" in err, err
    # rich prints ":100:" as an emoji unless told not to
    code, _, err = run_cli("show", examples["piano"], "--bars", "99:100", "-o", tmp_path / "p.png")
    assert code == 1 and "--bars 99:100: the file has 4 bars" in err, err


def test_show_bad_files(run_cli, midi_factory, tmp_path):
    empty = midi_factory("empty.mid", [])
    code, _, err = run_cli("show", empty, "-o", tmp_path / "e.png")
    assert code == 1 and "no notes to draw" in err and not (tmp_path / "e.png").exists()
    junk = tmp_path / "junk.mid"
    junk.write_bytes(b"not midi at all")
    code, _, err = run_cli("show", junk, "-o", tmp_path / "j.png")
    assert code == 1 and "not a MIDI file" in err and len(err.strip().splitlines()) == 1


def test_bar_grid_follows_meter_changes(midi_factory):
    path = midi_factory("meters.mid", CHORD, time_signatures=((4, 4, 0), (3, 4, 1920), (6, 8, 3360)))
    score = symusic.Score(str(path))
    score.tracks[0].notes.append(symusic.Note(4800, 100, 60, 80))  # the file runs to tick 4900
    grid = bar_grid(score)
    assert list(grid.starts[:5]) == [0, 1920, 3360, 4800, 6240]  # 4/4, 3/4, then 6/8 bars of 1440
    assert list(grid.beats[4:7]) == [1920, 2400, 2880]


def test_continue_marks_where_the_new_bars_begin_and_draws_it(run_cli, tiny_checkpoint, examples, tmp_path):
    out = tmp_path / "more.mid"
    code, _, err = run_cli("continue", examples["piano"], "-m", tiny_checkpoint, "--bars", 2, "-o", out, "--png")
    assert code == 0, err
    score = symusic.Score(str(out))
    marks = [m.time for m in score.markers if m.text == CONTINUATION_MARKER]
    prompt = symusic.Score(str(examples["piano"]))
    last_onset = max(n.time for t in prompt.tracks for n in t.notes)
    # one marker, on the bar line after the prompt's last note (the piano phrase is in 4/4)
    assert len(marks) == 1 and marks[0] > last_onset and marks[0] % (4 * prompt.ticks_per_quarter) == 0, marks
    assert imread(out.with_suffix(".png")).shape[1] >= 900


def test_show_beats_draws_the_annotated_bars(run_cli, midi_factory, tmp_path):
    """A file that says 1/4 (as POP909's do) has 16 one-beat bars; on its beat annotation of two
    beats of pickup, then 4-beat bars, it has a pickup bar and four bars, at the annotated downbeats."""
    notes = [(0, False, 60 + k % 5, k * 480, k * 480 + 240, 80) for k in range(18)]
    src = midi_factory("q.mid", notes, time_signatures=((1, 4, 0),))
    beats = tmp_path / "q.txt"  # 120 BPM: a beat every 0.5 s; downbeats on beats 2, 6, 10, 14
    beats.write_text("".join(f"{k * 0.5:.2f} {1 - k % 2} {int(k % 4 == 2)}\n" for k in range(18)))
    code, _, err = run_cli("show", src, "--bars", "20:21", "-o", tmp_path / "a.png")
    assert code == 1 and "has 18 bars" in err
    code, _, err = run_cli("show", src, "--beats", beats, "--bars", "20:21", "-o", tmp_path / "b.png")
    assert code == 1 and "has 5 bars" in err
    code, _, err = run_cli("show", src, "--beats", beats, "--bars", "2:3", "-o", tmp_path / "c.png")
    assert code == 0, err
    from spemusic.music.pianoroll import annotated_grid
    from spemusic.tokens.beats import read_beats

    grid = annotated_grid(symusic.Score(str(src)), read_beats(beats))
    assert grid.starts[:5].tolist() == [0, 960, 2880, 4800, 6720]
    code, _, err = run_cli("show", src, "--beats", tmp_path / "missing.txt", "-o", tmp_path / "d.png")
    assert code == 1 and "missing.txt" in err and "Traceback" not in err


def test_every_groove_drum_has_a_name_and_room_for_it():
    import pretty_midi

    from spemusic.music.pianoroll import _drum_name, render

    groove_kit = (22, 26, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 55, 57, 58, 59)
    assert all(_drum_name(pretty_midi, p)[0].isalpha() for p in groove_kit)
    score = symusic.Score(480)
    track = symusic.Track("drums", 0, True)
    for i, p in enumerate(groove_kit):
        track.notes.append(symusic.Note(i * 120, 60, p, 100))
    score.tracks.append(track)
    import io

    from matplotlib.image import imread as read

    img = read(io.BytesIO(render(score, ".png", size=(900, 760))))
    ink = (img[:, :, :3].mean(-1) < 0.5).any(0)
    # the labels start right of the image's left edge (a cut label would touch it)
    assert not ink[:3].any() and ink[3:60].any()


def test_a_long_piece_is_drawn_in_rows_of_bars(run_cli, midi_factory, tmp_path):
    """60 bars: rows of 16 bars, a page as wide as one row, not a strip 4,000 px wide; an asked
    --size or --bars range of up to 32 bars stays one row."""
    notes = [(0, False, 60 + k % 7, k * 480, k * 480 + 400, 80) for k in range(240)]
    src = midi_factory("long.mid", notes)
    code, _, err = run_cli("show", src, "-o", tmp_path / "long.png")
    assert code == 0, err
    h, w = imread(tmp_path / "long.png").shape[:2]
    assert w < 1400 and h > 3 * 400  # four rows
    code, _, err = run_cli("show", src, "--bars", "1:24", "-o", tmp_path / "short.png")
    h, w = imread(tmp_path / "short.png").shape[:2]
    assert code == 0 and w > h
    code, _, err = run_cli("show", src, "--size", "2000x500", "-o", tmp_path / "sized.png")
    assert code == 0 and imread(tmp_path / "sized.png").shape[:2] == (500, 2000)
