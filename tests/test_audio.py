"""`spemusic render` and `--audio`: MIDI to audio with a General MIDI SoundFont."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile
import symusic

from spemusic.music import audio
from spemusic.music.audio import bundled_soundfont, hold_sustained_notes, render

CHORD = [(0, False, p, 0, 960, 90) for p in (60, 64, 67)]  # one 4/4 half note chord at 120 BPM: 1 s


@pytest.fixture(autouse=True)
def small_soundfont(monkeypatch):
    """Every test renders with pretty_midi's TimGM6mb, found on any machine, whatever else is installed."""
    font = bundled_soundfont()
    if font is None:
        pytest.skip("pretty_midi's TimGM6mb.sf2 is missing")
    monkeypatch.setenv(audio.SOUNDFONT_ENV, str(font))
    return font


def midi_seconds(path) -> float:
    return symusic.Score(str(path)).to("second").end()


@pytest.mark.parametrize("suffix", [".wav", ".flac", ".ogg", ".mp3"])
def test_render_writes_stereo_audio_as_long_as_the_music(run_cli, examples, tmp_path, suffix):
    out = tmp_path / f"piano{suffix}"
    code, _, err = run_cli("render", examples["piano"], "-o", out)
    assert code == 0, err
    assert "TimGM6mb.sf2" in err  # says which SoundFont it used
    samples, rate = soundfile.read(out)
    assert rate == 44100 and samples.ndim == 2 and samples.shape[1] == 2
    seconds = len(samples) / rate
    music = midi_seconds(examples["piano"])
    assert music - 0.05 <= seconds <= music + 3.0, (seconds, music)  # the music, then the last release
    assert np.sqrt(np.mean(samples ** 2)) > 0.01  # not silent
    assert 0.8 < np.abs(samples).max() <= 1.0  # normalised to -1 dBFS (lossy codecs overshoot a little)


def test_tempo_map_drums_and_sample_rate_are_honoured(run_cli, midi_factory, tmp_path):
    slow = midi_factory("slow.mid", CHORD + [(0, False, 72, 1920, 3840, 90)], tempos=((120.0, 0), (60.0, 1920)))
    out = tmp_path / "slow.wav"
    code, _, err = run_cli("render", slow, "-o", out, "--sample-rate", "22050")
    assert code == 0, err
    info = soundfile.info(out)
    assert info.samplerate == 22050
    assert 4.0 <= info.duration <= 7.0  # two beats at 120 BPM, then four at 60: 5 s and a release

    hits = [(0, True, 38, t, t + 120, 100) for t in range(0, 1920, 240)]
    as_drums = render(symusic.Score(str(midi_factory("drums.mid", hits))), bundled_soundfont())
    as_piano = render(symusic.Score(str(midi_factory("keys.mid", [(0, False, *h[2:]) for h in hits]))), bundled_soundfont())
    # channel 10 plays the drum kit: a snare's noise reaches far higher than a piano's D2
    high = []
    for a in (as_drums, as_piano):
        power, freq = np.abs(np.fft.rfft(a[:, 0])) ** 2, np.fft.rfftfreq(len(a), 1 / 44100)
        high.append(power[freq > 2000].sum() / power.sum())
    assert high[0] > 2 * high[1], high  # measured 0.068 against 0.026


def test_sustain_pedal_holds_notes_until_it_lifts(midi_factory):
    score = symusic.Score(str(midi_factory("pedal.mid", CHORD + [(0, False, 72, 1000, 1200, 90)])))
    track = score.tracks[0]
    track.pedals.append(symusic.Pedal(480, 1440))  # down at beat 2, up at beat 5
    held = {(n.pitch, n.time): n.end for n in hold_sustained_notes(score).tracks[0].notes}
    assert held[(60, 0)] == 1920 and held[(72, 1000)] == 1920  # both end inside the pedal: held to its end
    assert {(n.pitch, n.time): n.end for n in score.tracks[0].notes}[(60, 0)] == 960  # the input is untouched
    assert len(render(score, bundled_soundfont())) > len(render(symusic.Score(str(midi_factory("nopedal.mid", CHORD))),
                                                               bundled_soundfont()))


def test_a_render_spoilt_by_the_synthesizer_is_made_again_by_a_fresh_one():
    """prestosynth, once it holds many voices, can render NaN frames (`play` met it): the notes are
    rendered again by a fresh synthesizer, which replaces the spoilt one."""
    class Spoilt:
        def render(self, score, stereo):
            return np.full((2, 100), np.nan, dtype=np.float32)

    score = symusic.Score(480)
    track = symusic.Track(program=0)
    track.notes.append(symusic.Note(0, 480, 60, 80))
    score.tracks.append(track)
    synth, out = audio.synthesize(Spoilt(), score, bundled_soundfont(), 44100)
    assert not isinstance(synth, Spoilt) and np.isfinite(out).all() and np.abs(out).max() > 0


def test_folder_mode_and_format(run_cli, examples, tmp_path):
    code, _, err = run_cli("render", examples["groove"].parent, "-o", tmp_path / "audio/", "--format", "flac")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "audio").iterdir()) == ["groove.flac", "piano.flac"]


def test_a_midi_without_notes_is_a_clear_error_and_no_file(run_cli, midi_factory, tmp_path):
    empty = midi_factory("empty.mid", [])
    out = tmp_path / "empty.wav"
    code, _, err = run_cli("render", empty, "-o", out)
    assert code == 1 and "no notes" in err and str(empty) in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize("case", ["missing", "not-a-soundfont", "folder", "env-missing", "none-anywhere"])
def test_bad_or_missing_soundfont_is_one_line(run_cli, examples, tmp_path, monkeypatch, case):
    junk = tmp_path / "junk.sf2"
    junk.write_bytes(b"RIFF\x00\x00\x00\x00WAVEfmt not a soundfont")
    args = {"missing": ["--soundfont", tmp_path / "nope.sf2"], "not-a-soundfont": ["--soundfont", junk],
            "folder": ["--soundfont", tmp_path]}.get(case, [])
    if case == "env-missing":
        monkeypatch.setenv(audio.SOUNDFONT_ENV, str(tmp_path / "gone.sf2"))
    if case == "none-anywhere":
        monkeypatch.delenv(audio.SOUNDFONT_ENV)
        monkeypatch.setattr(audio, "soundfont_candidates", lambda: [tmp_path / "nowhere.sf2"])
    out = tmp_path / "out.wav"
    code, _, err = run_cli("render", examples["piano"], "-o", out, *args)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    expected = {"missing": "no such file", "not-a-soundfont": "not a SoundFont 2 file", "folder": "not a file",
                "env-missing": "SPEMUSIC_SOUNDFONT", "none-anywhere": "apt-get install fluid-soundfont-gm"}[case]
    assert expected in err, err
    assert not out.exists()


def test_bad_render_options(run_cli, examples, tmp_path):
    code, _, err = run_cli("render", examples["piano"], "-o", tmp_path / "x.aiff")
    assert code == 1 and "cannot write a .aiff file" in err
    code, _, err = run_cli("render", examples["piano"], "--format", "midi", "-o", tmp_path / "y/")
    assert code == 1 and "use wav, flac, ogg, mp3" in err
    assert not list(tmp_path.iterdir())


def test_generate_audio_writes_a_wav_beside_the_midi(run_cli, tiny_checkpoint, tmp_path):
    out = tmp_path / "piece.mid"
    code, stdout, err = run_cli("generate", "--model", tiny_checkpoint, "--bars", "2", "--seed", "0", "--audio",
                                "--json", "-o", out)
    assert code == 0, err
    record = json.loads(stdout)
    assert record["audio"] == str(out.with_suffix(".wav"))
    info = soundfile.info(record["audio"])
    assert info.channels == 2 and record["music_seconds"] - 0.05 <= info.duration <= record["music_seconds"] + 3.0


def test_generate_audio_without_a_soundfont_writes_nothing(run_cli, tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv(audio.SOUNDFONT_ENV, str(tmp_path / "gone.sf2"))
    code, _, err = run_cli("generate", "--model", tiny_checkpoint, "--bars", "2", "--audio", "-o", tmp_path / "p.mid")
    assert code == 1 and "gone.sf2: no such file" in err
    assert not list(p for p in tmp_path.iterdir() if p.suffix in (".mid", ".wav"))
