"""Hardening, second round (issue 39): render, show, play, --audio, --png, --chords and --beats as
robust as the older commands. Each test names the item it covers; every odd input is made here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import symusic

from spemusic.errors import SpemusicError

SPEMUSIC = [sys.executable, "-m", "spemusic"]


def one_line_error(code: int, err: str) -> None:
    assert code == 1, err
    assert "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err


def piano(midi_factory, name="p.mid", bars=2, **kw) -> Path:
    return midi_factory(name, [(0, False, 60 + i % 7, i * 480, i * 480 + 400, 90) for i in range(4 * bars)], **kw)


def raw_midi(path: Path, ticks_per_quarter: int, events: bytes) -> Path:
    """A one-track MIDI file of the given track events, with any ticks per quarter (even 0)."""
    body = events + b"\x00\xff\x2f\x00"
    path.write_bytes(b"MThd" + (6).to_bytes(4, "big") + (0).to_bytes(2, "big") + (1).to_bytes(2, "big")
                     + ticks_per_quarter.to_bytes(2, "big") + b"MTrk" + len(body).to_bytes(4, "big") + body)
    return path


def vlq(n: int) -> bytes:
    out = [n & 0x7F]
    while n > 0x7F:
        n >>= 7
        out.append(0x80 | (n & 0x7F))
    return bytes(reversed(out))


# ----------------------------------------------------------------------------- 1: concurrent writers

def test_a_name_taken_meanwhile_is_refused_not_replaced(tmp_path):
    from spemusic.files import write_output

    dest = tmp_path / "same.mid"
    write_output(b"first", dest, overwrite=False)
    with pytest.raises(SpemusicError, match="another process wrote it meanwhile"):
        write_output(b"second", dest, overwrite=False)
    assert dest.read_bytes() == b"first"
    assert [p.name for p in tmp_path.iterdir()] == ["same.mid"]  # no temporary file left
    write_output(b"third", dest, overwrite=True)
    assert dest.read_bytes() == b"third"


def test_four_renders_of_one_name_give_one_winner(midi_factory, tmp_path):
    src = piano(midi_factory, bars=8)
    procs = [subprocess.Popen([*SPEMUSIC, "render", str(src), "-o", str(tmp_path / "same.wav")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [(p.wait(), p.stderr.read()) for p in procs]
    won = [err for code, err in results if code == 0]
    lost = [err for code, err in results if code != 0]
    assert len(won) + len(lost) == 4 and won, results
    for err in lost:
        assert "already exists" in err and "Traceback" not in err, err
    # a winner's "rendered" is true: at most one process wrote the file (the others checked too late)
    assert len(won) == 1 or all("already exists" not in e for e in won)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("same", ".same"))) == ["same.wav"]


# ----------------------------------------------------------------------------- 2, 19: play's stdout

def test_play_record_is_written_when_the_reader_leaves(tmp_path):
    record = tmp_path / "r.mid"
    cmd = f"{' '.join(SPEMUSIC)} play --model groove --bars 3 --seed 1 --stdout-midi --record {record} | head -c 30 > /dev/null"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "stdout closed by its reader" in done.stderr and "Traceback" not in done.stderr
    assert record.is_file() and record.stat().st_size > 0


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
def test_play_to_a_full_stdout_names_it():
    with open("/dev/full", "wb") as full:
        done = subprocess.run([*SPEMUSIC, "play", "--model", "groove", "--bars", "1", "--stdout-midi"], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == "error: stdout: No space left on device"


# ----------------------------------------------------------------------------- 3, 6, 11: one reader policy

@pytest.mark.parametrize("command,suffix", [("render", ".wav"), ("show", ".png"), ("tokenize", ".txt")])
def test_render_and_show_refuse_what_tokenize_refuses(run_cli, tmp_path, command, suffix):
    far = raw_midi(tmp_path / "far.mid", 480, b"".join(b"\x00\xff\x01\x01x" if i == 0 else vlq(240_000_000) + b"\xff\x01\x01x"
                                                         for i in range(10)) + b"\x00\x90\x3c\x50" + vlq(480) + b"\x80\x3c\x00")
    zero = raw_midi(tmp_path / "zero.mid", 0, b"\x00\x90\x3c\x50\x01\x80\x3c\x00")
    for src, message in ((far, "beyond tick 2^31"), (zero, "invalid ticks per beat (0)")):
        out = tmp_path / (src.stem + suffix)
        code, _, err = run_cli(command, src, "-o", out)
        one_line_error(code, err)
        assert message in err and not out.exists()


def test_show_of_one_tick_per_quarter_in_eighth_bars_ends(tmp_path):
    src = raw_midi(tmp_path / "tpq1.mid", 1, b"\x00\xff\x58\x04\x01\x03\x18\x08"  # 1/8
                   + b"".join(b"\x00\x90" + bytes([60 + i, 80]) + b"\x01\x80" + bytes([60 + i, 0]) for i in range(8)))
    done = subprocess.run([*SPEMUSIC, "show", str(src), "-o", str(tmp_path / "t.png")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "t.png").stat().st_size > 0


def test_show_of_a_folder_skips_a_broken_file_and_draws_the_rest(run_cli, midi_factory, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    piano(midi_factory, "good.mid").rename(folder / "good.mid")
    raw_midi(folder / "zero.mid", 0, b"\x00\x90\x3c\x50\x01\x80\x3c\x00")
    code, _, err = run_cli("show", folder, "-o", tmp_path / "out")
    assert code == 0 and "zero.mid: invalid ticks per beat" in err and "Traceback" not in err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["good.png"]


# ----------------------------------------------------------------------------- 4, 5, 12: beat annotations

@pytest.mark.parametrize("spacing", [0.01, 1e-9])
def test_beats_closer_than_any_tempo_are_refused(run_cli, midi_factory, tmp_path, spacing):
    beats = tmp_path / "beats.txt"
    beats.write_text("".join(f"{i * spacing:.12f} {1 + i % 4}\n" for i in range(400)))
    for args in (("tokenize", piano(midi_factory), "-o", tmp_path / "t.txt"),
                 ("continue", piano(midi_factory), "--bars", "1", "-o", tmp_path / "c.mid")):
        code, _, err = run_cli(*args, "--beats", beats)
        one_line_error(code, err)
        assert "faster than 1,200 beats per minute" in err
    assert not (tmp_path / "t.txt").exists() and not (tmp_path / "c.mid").exists()


def test_another_songs_shorter_beats_are_refused(run_cli, shared_data, tmp_path):
    pop = shared_data / "pop909"
    code, _, err = run_cli("tokenize", pop / "010.mid", "--beats", pop / "beats" / "013.txt", "-o", tmp_path / "t.txt")
    one_line_error(code, err)
    assert "before the end of" in err and "is it this file's annotation?" in err


# ----------------------------------------------------------------------------- 7, 8, 9, 10: render

def test_render_writes_a_long_ogg_in_blocks(midi_factory, tmp_path):
    src = piano(midi_factory, bars=40)  # 80 s at 120 BPM: libsndfile 1.2.2 crashed writing it at once
    done = subprocess.run([*SPEMUSIC, "render", str(src), "-o", str(tmp_path / "long.ogg")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr)
    import soundfile

    assert soundfile.info(str(tmp_path / "long.ogg")).duration > 79


def test_render_in_segments_sounds_as_a_whole_render(midi_factory):
    import symusic

    from spemusic.music.audio import bundled_soundfont, hold_sustained_notes, render

    font = bundled_soundfont()
    if font is None:
        pytest.skip("no bundled SoundFont")
    score = symusic.Score(str(piano(midi_factory, bars=40)))
    whole = symusic.Synthesizer(str(font), 44100).render(hold_sustained_notes(score), True).T
    whole = whole * (10 ** (-1 / 20) / np.abs(whole).max())
    ours = render(score, font)
    assert ours.shape == whole.shape
    # the same notes, each placed within a sample of the whole render's (float times in seconds)
    assert np.sqrt(((ours - whole) ** 2).mean() / (whole ** 2).mean()) < 0.1


def test_a_long_silence_is_rendered_a_segment_at_a_time(midi_factory):
    """Two notes 40 minutes apart (found by benchmarks/fuzz_midi.py): the silence between them
    comes out in blocks of one segment, not as one 800 MB buffer, and the audio is whole."""
    from spemusic.music.audio import SAMPLE_RATE, SEGMENT_SECONDS, bundled_soundfont, render_blocks

    font = bundled_soundfont()
    if font is None:
        pytest.skip("no bundled SoundFont")
    far = 2400 * 2 * 480  # 2,400 s at 120 BPM
    score = symusic.Score(str(midi_factory("gap.mid", [(0, False, 60, 0, 400, 90), (0, False, 64, far, far + 400, 90)])))
    blocks = [len(b) for b in render_blocks(score, font)]
    assert max(blocks) <= (SEGMENT_SECONDS + 5) * SAMPLE_RATE
    assert 2400 * SAMPLE_RATE < sum(blocks) < 2410 * SAMPLE_RATE


def test_show_a_drum_track_silent_in_the_bars_drawn(run_cli, midi_factory, tmp_path):
    """A drum track whose hits all lie outside the bars drawn: no drum rows, no traceback (fuzz)."""
    src = midi_factory("late-drums.mid", [(0, False, 60, 0, 400, 90), (0, True, 36, 40 * 1920, 40 * 1920 + 60, 100)])
    code, _, err = run_cli("show", src, "--bars", "1:2", "-o", tmp_path / "d.png")
    assert code == 0, err


def test_ctrl_c_while_render_encodes_exits_130_with_nothing_written(midi_factory, tmp_path):
    src = piano(midi_factory, bars=600)  # 20 minutes: a few seconds of Ogg encoding
    out = tmp_path / "long.ogg"
    proc = subprocess.Popen([*SPEMUSIC, "render", str(src), "-o", str(out)], stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(4)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    if proc.returncode == 0:
        pytest.skip("the render finished before the Ctrl-C")
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "interrupted", err
    assert "Traceback" not in err and [p.name for p in tmp_path.iterdir() if p != src] == []


def test_mp3_at_96_khz_is_refused_before_the_work(run_cli, midi_factory, tmp_path):
    code, _, err = run_cli("render", piano(midi_factory), "-o", tmp_path / "a.mp3", "--sample-rate", "96000")
    one_line_error(code, err)
    assert "MP3 has no 96,000 Hz" in err and not (tmp_path / "a.mp3").exists()


# ----------------------------------------------------------------------------- 13-18: options

def test_a_huge_chord_strength_is_refused(run_cli, tmp_path):
    code, _, err = run_cli("generate", "--chords", "C G", "--chord-strength", "1e308", "--bars", "1",
                           "-o", tmp_path / "a.mid")
    one_line_error(code, err)
    assert "--chord-strength must be between 0 and 100" in err


@pytest.mark.parametrize("seed", ["-1", str(2**64)])
def test_train_seed_out_of_range(run_cli, tmp_path, seed):
    code, _, err = run_cli("train", tmp_path, "-o", tmp_path / "run", "--steps", "1", "--seed", seed)
    one_line_error(code, err)
    assert "--seed must be between 0 and 2^31 - 1" in err


def test_chords_naming_a_file_says_what_is_wrong_with_it(run_cli, tmp_path):
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo")
    for spec, message in ((tmp_path / "missing.txt", "no such chord file"), (tmp_path / "folder", "is a folder"),
                          (tmp_path / "fifo", "named pipe"), ("/dev/zero", "is a device")):
        code, _, err = run_cli("generate", "--chords", spec, "--bars", "1", "-o", tmp_path / "a.mid")
        one_line_error(code, err)
        assert message in err and "unknown chord" not in err, err


def test_broken_soundfont_is_refused_before_sampling(run_cli, tmp_path, monkeypatch):
    junk = tmp_path / "junk.sf2"
    junk.write_bytes(b"RIFF\x00\x00\x00\x00sfbk" + bytes(5000))
    monkeypatch.setenv("SPEMUSIC_SOUNDFONT", str(junk))
    code, _, err = run_cli("generate", "--audio", "--bars", "1", "-o", tmp_path / "a.mid")
    one_line_error(code, err)
    assert "cannot read the SoundFont" in err and not (tmp_path / "a.mid").exists()
    code, _, err = run_cli("play", "--soundfont", junk, "--bars", "1")
    one_line_error(code, err)


def test_png_and_audio_into_a_new_folder(run_cli, tmp_path):
    out = tmp_path / "new" / "deeper"
    code, _, err = run_cli("generate", "--model", "groove", "--length", "64", "--seed", "1", "--png", "--audio",
                           "-o", f"{out}/")
    assert code == 0, err
    assert sorted(p.suffix for p in out.iterdir()) == [".mid", ".png", ".wav"]


def test_a_folder_where_every_file_fails_says_so(run_cli, tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    for name in ("a.mid", "b.mid"):
        (folder / name).write_bytes(b"junk")
    code, _, err = run_cli("tokenize", folder, "-o", tmp_path / "out")
    assert code == 1 and err.strip().splitlines()[-1] == "error: no file written: all 2 inputs were skipped"
