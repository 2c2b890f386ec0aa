"""`spemusic play`: bars sampled without end, paced to real time (here on a fast, simulated clock)."""

from __future__ import annotations

import numpy as np
import pytest

from spemusic.generation import play as play_module
from spemusic.generation.play import BarTimer, Player, play
from spemusic.music.audio import bundled_soundfont
from spemusic.nn.checkpoint import load_model
from spemusic.tokens.tokenizer import REMITokenizer


class FakeClock:
    """Simulated time: it moves only when someone sleeps, so sampling costs no time at all and
    the pacing is all in the sleeps."""

    def __init__(self):
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.0)


@pytest.fixture
def tiny(tiny_checkpoint):
    return load_model(str(tiny_checkpoint))


def test_bar_timer_carries_meter_and_tempo():
    tok = REMITokenizer()
    ids = tok.tokens_to_ids
    tempo_120 = tok.range("Tempo")[0] + int(tok.tempo_bin([120.0])[0])
    bpm = float(tok.tempo_values[tempo_120 - tok.range("Tempo")[0]])
    timer = BarTimer(tok)
    first = timer.time(list(ids(["Bar", "TimeSig_3/4", "Position_0"])) + [tempo_120]
                       + list(ids(["Program_0", "Pitch_60", "Velocity_20", "Duration_12"])))
    assert first.seconds == pytest.approx(3 * 60 / bpm, rel=1e-3)
    assert first.score.note_num() == 1
    second = timer.time(list(ids(["Bar", "Position_12", "Program_0", "Pitch_62", "Velocity_20", "Duration_12"])))
    assert second.seconds == pytest.approx(3 * 60 / bpm, rel=1e-3)  # 3/4 and the tempo carry over
    note = second.score.to("second").tracks[0].notes[0]
    assert note.time == pytest.approx(60 / bpm, rel=1e-3)  # Position_12 is the second beat


def test_audio_is_paced_and_as_long_as_the_bars(tiny):
    model, tok = tiny
    clock, blocks = FakeClock(), []
    player = Player(audio_out=lambda b: blocks.append((clock.now(), len(b))), soundfont=bundled_soundfont(),
                    clock=clock, lead=0.25)
    result = play(model, tok, player, seed=0, bars=8, ahead=2.0)
    assert result.bars == 8 and len(player.bar_ends) == 8
    frames = sum(n for _, n in blocks)
    assert frames == pytest.approx((player.sampled + 0.5) * 44100, abs=2)  # the bars, then a 0.5 s release
    written = 0
    for when, n in blocks[:-1]:  # never more than `lead` seconds ahead of the music (the last: the release)
        written += n
        assert written / 44100 <= when - player.t0 + 0.25 + 1 / 44100  # (to the nearest sample)
    assert clock.now() - player.t0 == pytest.approx(player.sampled, abs=0.02)  # it took the music's own time


def test_midi_events_are_sent_on_time(tiny):
    model, tok = tiny
    clock, sent = FakeClock(), []
    player = Player(midi_out=lambda m: sent.append((clock.now(), m)), clock=clock)
    play(model, tok, player, seed=1, bars=4)
    sent_times = sorted(t - player.t0 for t, m in sent if m.type == "note_on")
    scheduled = sorted(player_schedule(model, tok, 1, 4))
    assert sent_times and len(sent_times) == len(scheduled)
    # every note goes out within one 10 ms pause of its time
    assert all(0 <= when - due < 0.0101 for when, due in zip(sent_times, scheduled))
    assert sent[-1][1].type == "control_change" and sent[-1][1].control == 123


def player_schedule(model, tok, seed, bars):
    """The note-on times of the same piece, worked out without a player."""
    from spemusic.generation.sampling import SamplingOptions, stream_bars

    options = SamplingOptions.for_model(model.release_name, own=model.sampling_defaults)  # play's, as the CLI's
    timer, start, out = BarTimer(tok), 0.0, []
    for i, bar in enumerate(stream_bars(model, tok, seed=seed, options=options)):
        timed = timer.time(bar)
        out += [start + n.time for track in timed.score.to("second").tracks for n in track.notes]
        start += timed.seconds
        if i + 1 == bars:
            break
    return out


def test_stop_ends_at_the_end_of_the_bar_playing(tiny):
    model, tok = tiny
    clock = FakeClock()
    player = Player(midi_out=lambda m: None, clock=clock)
    stop_at = 5.0  # seconds of music
    result = play(model, tok, player, seed=2, record=True,
                  should_stop=lambda: player.t0 is not None and clock.now() - player.t0 >= stop_at)
    ends = [e for e in player.bar_ends if e > stop_at - 0.011]
    assert result.music_seconds == pytest.approx(ends[0], abs=1e-6)  # the bar playing at the stop, to its end
    assert result.bars == sum(1 for e in player.bar_ends if e <= ends[0] + 1e-9)
    assert np.count_nonzero(np.array(result.tokens) == tok.bar_id) == result.bars  # --record keeps those bars


def test_play_stdout_bars_8_through_the_cli(tiny_checkpoint, tmp_path, monkeypatch, capsysbinary):
    import sys

    from spemusic.cli import main

    monkeypatch.setattr(play_module, "WallClock", FakeClock)
    monkeypatch.setenv("SPEMUSIC_SOUNDFONT", str(bundled_soundfont()))
    record = tmp_path / "played.mid"
    monkeypatch.setattr(sys, "argv", ["spemusic", "play", "--model", str(tiny_checkpoint), "--bars", "8", "--stdout",
                                      "--seed", "3", "--record", str(record)])
    with pytest.raises(SystemExit) as exit_:
        main()
    captured = capsysbinary.readouterr()
    err = captured.err.decode()
    assert exit_.value.code == 0, err
    assert "played 8 bars" in err and "sampling margin" in err
    audio = captured.out
    assert len(audio) % 4 == 0
    seconds = len(audio) / 4 / 44100
    import re

    minutes, secs = re.search(r"played 8 bars, (\d+):([\d.]+) of music", err).groups()
    music = 60 * int(minutes) + float(secs)
    # the 8 bars (printed to 0.1 s), then what still rings, for 0.5 s at most
    assert music - 0.06 <= seconds <= music + 0.5 + 0.06
    assert record.exists()
    samples = np.frombuffer(audio, dtype="<i2")
    assert np.abs(samples).max() > 1000  # not silent


@pytest.mark.parametrize("args,message", [
    (["--stdout", "--stdout-midi"], "give one"),
    (["--record", "x.wav", "--stdout-midi"], "give a .mid file"),
    (["--bars", "0", "--stdout-midi"], "--bars must be at least 1"),
    (["--temperature", "0", "--stdout-midi"], "--temperature"),
])
def test_play_bad_options(run_cli, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("play", *args)
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err


def test_play_port_errors_are_one_line(run_cli, tiny_checkpoint):
    code, _, err = run_cli("play", "--model", tiny_checkpoint, "--port", "no such port", "--bars", "1")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "python-rtmidi" in err or "no such MIDI output" in err


def test_play_with_a_config_plays_what_the_command_plays(tmp_path, monkeypatch, capsysbinary):
    """play() given a GenerationConfig (the seed, the bars; the model's own sampling defaults)
    records the bars `spemusic play` records with the same settings."""
    import sys

    from spemusic.cli import main
    from spemusic.generation.prompts import midi_bytes
    from spemusic.generation.settings import GenerationConfig

    monkeypatch.setattr(play_module, "WallClock", FakeClock)
    record = tmp_path / "played.mid"
    monkeypatch.setattr(sys, "argv", ["spemusic", "play", "--model", "groove", "--bars", "2", "--stdout-midi",
                                      "--seed", "7", "--record", str(record)])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 0, capsysbinary.readouterr().err.decode()
    model, tok = load_model("groove")
    report = play(model, tok, Player(midi_out=lambda message: None, clock=FakeClock()),
                  GenerationConfig(seed=7, bars=2), record=True)
    assert midi_bytes(tok.decode([tok.bos_id, *report.tokens, tok.eos_id])) == record.read_bytes()
