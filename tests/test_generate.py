"""spemusic generate / continue: validity by construction, determinism, prompt preservation,
bad input, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import miditoolkit
import mido
import numpy as np
import pretty_midi
import pytest
import torch

from spemusic.errors import OptionError
from spemusic.generation.sampling import SamplingOptions, filter_logits, sample
from spemusic.nn.checkpoint import load_model
from spemusic.tokens.grammar import REMIGrammar


def _notes(path) -> set:
    midi = miditoolkit.MidiFile(str(path))
    return {(int(i.program), bool(i.is_drum), n.pitch, n.start, n.end, n.velocity) for i in midi.instruments for n in i.notes}


def test_sampled_sequences_are_valid_and_retokenize_to_themselves(tiny_checkpoint, tmp_path):
    model, tok = load_model(tiny_checkpoint)
    grammar = REMIGrammar(tok)
    n_checked = 0
    for seed in range(3):
        result = sample(model, tok, num=4, length=300, seed=seed, options=SamplingOptions(temperature=1.2, top_p=1.0))
        for ids in result.ids:
            assert grammar.is_valid(ids), tok.ids_to_tokens(ids)[:50]
            path = tmp_path / f"s{seed}-{n_checked}.mid"
            tok.write_midi(ids, path, overlaps="layers")  # lossless: every sampled note kept whole
            again = tok.encode(path)
            assert np.array_equal(again, ids), "decoded piece does not re-tokenize to itself"
            # opens in the other MIDI libraries too
            assert len(pretty_midi.PrettyMIDI(str(path)).instruments) >= 1
            assert mido.MidiFile(str(path)).length > 0
            n_checked += 1
    assert n_checked == 12
    # sampling's half-precision step weights stay in its own state: the model's default is exact
    assert model.prime(torch.zeros(1, 2, dtype=torch.long))[1].plan.weights_dtype == torch.float32


def test_bars_mode_gives_complete_bars(tiny_checkpoint):
    model, tok = load_model(tiny_checkpoint)
    result = sample(model, tok, num=3, bars=4, seed=3)
    for ids in result.ids:
        assert np.count_nonzero(ids == tok.bar_id) == 4
        assert ids[-1] == tok.eos_id and REMIGrammar(tok).is_valid(ids)


def test_top_p_and_top_k_filtering():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], dtype=np.float32))
    kept = np.isfinite(filter_logits(logits, SamplingOptions(top_p=0.8)))
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 + 0.3 reaches 0.8
    kept = np.isfinite(filter_logits(logits, SamplingOptions(top_p=0.81)))
    assert kept.tolist() == [[True, True, True, False]]
    kept = np.isfinite(filter_logits(logits, SamplingOptions(top_p=1e-6)))
    assert kept.tolist() == [[True, False, False, False]]  # the most likely token always stays
    kept = np.isfinite(filter_logits(logits, SamplingOptions(top_k=2)))
    assert kept.tolist() == [[True, True, False, False]]
    masked = logits.copy()
    masked[0, 0] = float("-inf")  # grammar-masked tokens never come back
    kept = np.isfinite(filter_logits(masked, SamplingOptions(top_p=0.5)))
    assert kept.tolist() == [[False, True, False, False]]


def test_draw_follows_the_softmax_and_never_takes_a_masked_token():
    from spemusic.generation.sampling import draw

    logits = np.array([[-np.inf, np.log(0.5), np.log(0.3), np.log(0.2), -np.inf]] * 20_000, dtype=np.float32)
    drawn = draw(logits, np.random.default_rng(0))
    assert np.bincount(drawn, minlength=5)[[0, 4]].tolist() == [0, 0]
    assert np.allclose(np.bincount(drawn, minlength=5)[1:4] / len(drawn), [0.5, 0.3, 0.2], atol=0.015)
    assert np.array_equal(draw(logits[:8], np.random.default_rng(3)), draw(logits[:8], np.random.default_rng(3)))


def test_bar_top_p_keeps_the_meter_and_leaves_the_first_onset_to_the_model():
    # tokens: 0 and 1 two first onsets, 2 and 3 two meter changes (0.2 + 0.1 of the mass)
    logits = np.log(np.array([[0.4, 0.3, 0.2, 0.1]] * 2, dtype=np.float32))
    changes = np.array([False, False, True, True])
    opts = SamplingOptions(top_p=1.0, bar_top_p=0.7)
    kept = np.isfinite(filter_logits(logits, opts, at_bar=np.array([True, False]), changes=changes))
    # carrying on (0.7) reaches the nucleus: both changes go, both onsets stay
    assert kept.tolist() == [[True, True, False, False], [True, True, True, True]]
    kept = np.isfinite(filter_logits(logits, SamplingOptions(bar_top_p=0.8), np.array([True]), changes))
    assert kept[0].tolist() == [True, True, True, False]  # 0.7 + 0.2 reaches 0.8: the likelier change stays
    sure = np.log(np.array([[0.05, 0.05, 0.85, 0.05]], dtype=np.float32))
    kept = np.isfinite(filter_logits(sure, SamplingOptions(bar_top_p=0.8), np.array([True]), changes))
    assert kept[0].tolist() == [False, False, True, False]  # a change the model is sure of happens
    with pytest.raises(OptionError, match=r"^bar_top_p must be in \(0, 1\] \(got 0\)$"):
        SamplingOptions(bar_top_p=0).check()


def test_library_errors_name_parameters_and_the_cli_names_flags(run_cli, tmp_path):
    from spemusic.cli import _flag
    from spemusic.generation.sampling import check_length_bars
    from spemusic.music.keys import parse_key

    with pytest.raises(OptionError) as e:
        SamplingOptions(temperature=0).check()
    assert str(e.value) == "temperature must be between 0.001 and 1000 (got 0)"
    assert e.value.spelled(_flag) == "--temperature must be between 0.001 and 1000 (got 0)"
    with pytest.raises(OptionError) as e:
        check_length_bars(5, 2)
    assert str(e.value) == "give length or bars, not both" and "--" not in str(e.value)
    with pytest.raises(OptionError) as e:  # braces in user text are text, not fields
        parse_key("{tonic}")
    assert str(e.value).startswith("key '{tonic}': give a tonic")
    assert e.value.spelled(_flag).startswith("--key '{tonic}': give a tonic")
    code, _, err = run_cli("generate", "--temperature", 0, "--bars", 2, "-o", tmp_path / "x.mid")
    assert code == 1 and err.strip() == "error: --temperature must be between 0.001 and 1000 (got 0.0)", err
    code, _, err = run_cli("generate", "--key", "{tonic}", "--bars", 2, "-o", tmp_path / "x.mid")
    assert code == 1 and err.startswith("error: --key '{tonic}': give a tonic"), err


def test_generate_is_deterministic(run_cli, tiny_checkpoint, tmp_path):
    args = ["generate", "--model", tiny_checkpoint, "--length", 300, "--seed", 7]
    assert run_cli(*args, "-o", tmp_path / "a.mid")[0] == 0
    assert run_cli(*args, "-o", tmp_path / "b.mid")[0] == 0
    code, out, _ = run_cli("generate", "--model", tiny_checkpoint, "--length", 300, "--seed", 8, "-o", tmp_path / "c.mid",
                           "--json")
    assert code == 0
    assert (tmp_path / "a.mid").read_bytes() == (tmp_path / "b.mid").read_bytes()
    assert (tmp_path / "a.mid").read_bytes() != (tmp_path / "c.mid").read_bytes()
    record = json.loads(out.strip().splitlines()[-1])
    assert set(record) == {"file", "tokens", "bars", "new_bars", "notes", "music_seconds", "wall_seconds", "tokens_per_s", "seed"}
    assert record["seed"] == 8 and record["notes"] > 0 and record["tokens"] <= 300


def test_generate_precision_option(run_cli, tiny_checkpoint, tmp_path):
    args = ["generate", "--model", tiny_checkpoint, "--length", 100, "--seed", 3, "--json"]
    for precision in ("auto", "fp16", "bf16", "fp32"):
        code, out, _ = run_cli(*args, "--precision", precision, "-o", tmp_path / f"{precision}.mid")
        assert code == 0 and json.loads(out.strip().splitlines()[-1])["notes"] > 0
    code, _, err = run_cli(*args, "--precision", "fp8", "-o", tmp_path / "bad.mid")
    assert code == 2 and "fp8" in err
    assert not (tmp_path / "bad.mid").exists()


def test_auto_step_precision():
    from spemusic.generation.sampling import auto_step_dtype
    from spemusic.nn.device import cpu_has_fast_bf16

    fast = cpu_has_fast_bf16()
    assert auto_step_dtype("cpu", 1) == torch.float16
    assert auto_step_dtype("cpu", 4) == (torch.float16 if fast else torch.float32)
    assert auto_step_dtype("cpu", 8) == (torch.bfloat16 if fast else torch.float32)
    assert auto_step_dtype("cuda", 8) == torch.float16


def test_generate_num_writes_numbered_files(run_cli, tiny_checkpoint, tmp_path):
    code, out, _ = run_cli("generate", "--model", tiny_checkpoint, "--bars", 2, "--num", 3, "-o", tmp_path / "x.mid", "--json")
    assert code == 0
    files = [json.loads(line)["file"] for line in out.strip().splitlines()]
    assert files == [str(tmp_path / f"x-{i}.mid") for i in (1, 2, 3)]
    assert all(Path(f).is_file() for f in files)


@pytest.mark.parametrize("which", ["groove", "piano"])
def test_continue_keeps_the_prompt_note_for_note(run_cli, tiny_checkpoint, examples, tmp_path, which):
    prompt = examples[which]
    out = tmp_path / "cont.mid"
    code, _, err = run_cli("continue", prompt, "--model", tiny_checkpoint, "--bars", 2, "-o", out)
    assert code == 0, err
    before, after = _notes(prompt), _notes(out)
    assert before <= after, "a prompt note was changed or lost"
    new = after - before
    assert new, "nothing was added"
    prompt_end = max(n[4] for n in before)
    bar = 4 * miditoolkit.MidiFile(str(prompt)).ticks_per_beat
    assert min(n[3] for n in new) >= -(-max(n[3] for n in before) // bar) * bar  # new notes start in a new bar
    assert prompt_end > 0
    src = miditoolkit.MidiFile(str(prompt))
    got = miditoolkit.MidiFile(str(out))
    assert got.ticks_per_beat == src.ticks_per_beat
    assert got.tempo_changes[0].tempo == pytest.approx(src.tempo_changes[0].tempo)
    assert (got.time_signature_changes[0].numerator, got.time_signature_changes[0].denominator) == (4, 4)


def test_continue_prompt_bars_and_only_continuation(run_cli, tiny_checkpoint, examples, tmp_path):
    prompt = examples["piano"]
    out = tmp_path / "cont.mid"
    # a fixed seed: without one every run draws a new piece, and the tiny model's new bar may be empty
    code, _, err = run_cli("continue", prompt, "--model", tiny_checkpoint, "--prompt-bars", 2, "--bars", 1,
                           "--seed", 1, "-o", out)
    assert code == 0, err
    bar = 4 * 480
    kept = {n for n in _notes(prompt) if n[3] < 2 * bar}
    got = _notes(out)
    assert kept <= got
    assert not any(n in got for n in _notes(prompt) - kept)  # bars 3-4 of the prompt are not used
    only = tmp_path / "only.mid"
    code, _, err = run_cli("continue", prompt, "--model", tiny_checkpoint, "--prompt-bars", 2, "--bars", 1,
                           "--only-continuation", "--seed", 1, "-o", only)
    assert code == 0, err
    notes = _notes(only)
    assert notes and min(n[3] for n in notes) < bar and not (notes & kept)


def test_prompt_bars_count_from_the_first_note(run_cli, tiny_checkpoint, midi_factory, tmp_path):
    bar = 4 * 480
    late = midi_factory("intro.mid", [(0, False, 60 + i, (3 + i) * bar, (3 + i) * bar + 480, 80) for i in range(4)])
    out = tmp_path / "cont.mid"
    code, stdout, err = run_cli("continue", late, "--model", tiny_checkpoint, "--prompt-bars", 2, "--bars", 1,
                                "--json", "-o", out)
    assert code == 0, err
    assert "its first 3 bars hold no note: --prompt-bars 2 takes bars 4-5" in " ".join(err.split())
    assert json.loads(stdout)["bars"] == 3 + 2 + 1
    assert {n[2] for n in _notes(late) if n[3] < 5 * bar} <= {n[2] for n in _notes(out)}
    code, _, err = run_cli("continue", late, "--model", tiny_checkpoint, "--prompt-bars", 5, "--bars", 1, "-o",
                           tmp_path / "more.mid")
    assert code == 1 and "has 4 bars from its first note (bar 4)" in err
    # --from-bar counts the file's own bars, empty ones included
    code, stdout, err = run_cli("continue", late, "--model", tiny_checkpoint, "--from-bar", 5, "--bars", 1, "--json",
                                "-o", tmp_path / "from5.mid")
    assert code == 0 and json.loads(stdout)["bars"] == 6, err
    assert {n[2] for n in _notes(tmp_path / "from5.mid") if n[3] < 5 * bar} == {60, 61}  # bars 4 and 5 kept
    for args, message in ((["--from-bar", 2], "bars 1-2 of"), (["--from-bar", 9], "has bars 1 to 7"),
                          (["--from-bar", 5, "--prompt-bars", 2], "give one")):
        code, _, err = run_cli("continue", late, "--model", tiny_checkpoint, *args, "--bars", 1, "-o",
                               tmp_path / "no.mid")
        assert code == 1 and message in " ".join(err.split()) and not (tmp_path / "no.mid").exists(), err


def test_an_out_of_range_controller_value_is_clipped_with_a_warning(run_cli, tiny_checkpoint, tmp_path):
    import struct

    track = bytes([0x00, 0xB0, 0x07, 0xA8,  # controller 7 = 168: a data byte above 127
                   0x00, 0x90, 0x3C, 0x64, 0x83, 0x60, 0x80, 0x3C, 0x40,
                   0x00, 0x90, 0x3E, 0x64, 0x83, 0x60, 0x80, 0x3E, 0x40, 0x00, 0xFF, 0x2F, 0x00])
    odd = tmp_path / "odd.mid"
    odd.write_bytes(b"MThd" + struct.pack(">IHHH", 6, 0, 1, 480) + b"MTrk" + struct.pack(">I", len(track)) + track)
    with pytest.raises(Exception, match="data byte"):
        miditoolkit.MidiFile(str(odd))  # a strict reader refuses the whole song
    code, _, err = run_cli("continue", odd, "--model", tiny_checkpoint, "--bars", 1, "-o", tmp_path / "out.mid")
    assert code == 0, err
    assert "controller 7 value 168 outside 0-127, clipped to 127, at tick 0" in " ".join(err.split())
    assert {60, 62} <= {n[2] for n in _notes(tmp_path / "out.mid")}


def test_continue_picks_groove_for_drums(examples):
    from spemusic.generation.prompts import load_prompt
    from spemusic.tokens.tokenizer import REMITokenizer

    assert load_prompt(examples["groove"], REMITokenizer()).only_drums
    assert not load_prompt(examples["piano"], REMITokenizer()).only_drums


def _bad_cases(tmp_path, examples, ckpt):
    empty = tmp_path / "empty.mid"
    empty.write_bytes(b"")
    garbage = tmp_path / "garbage.mid"
    garbage.write_bytes(b"this is not a MIDI file at all" * 10)
    truncated = tmp_path / "truncated.mid"
    truncated.write_bytes(examples["piano"].read_bytes()[:60])
    noteless = tmp_path / "noteless.mid"
    miditoolkit.MidiFile(ticks_per_beat=480).dump(str(noteless))
    exists = tmp_path / "exists.mid"
    exists.write_bytes(b"keep me")
    m = ["--model", ckpt]
    return [
        (["continue", tmp_path / "missing.mid", *m, "--bars", 1], "no such file"),
        (["continue", empty, *m, "--bars", 1], "empty"),
        (["continue", garbage, *m, "--bars", 1], "not a MIDI file"),
        (["continue", truncated, *m, "--bars", 1], "truncated.mid"),
        (["continue", noteless, *m, "--bars", 1], "no notes"),
        (["continue", examples["groove"], *m, "--prompt-bars", 9, "--bars", 1], "has 2 bars"),
        (["generate", *m, "--length", 0], "--length must be at least 1"),
        (["generate", *m], "give --length"),
        (["generate", *m, "--length", 10, "--temperature", 0], "--temperature"),
        (["generate", *m, "--length", 10, "--top-p", 1.5], "--top-p"),
        (["generate", *m, "--length", 10, "--top-k", -1], "--top-k"),
        (["generate", *m, "--length", 10, "--num", 0], "--num"),
        (["generate", "--model", "no-such-model", "--length", 10], "unknown model"),
        (["generate", "--model", garbage, "--length", 10], "not a spemusic checkpoint"),
        (["generate", *m, "--length", 10, "-o", tmp_path / "nofolder" / "x.mid"], "does not exist"),
        (["generate", *m, "--length", 10, "-o", exists], "already exists"),
        (["generate", *m, "--length", "ten"], "--length"),
        (["continue", examples["piano"], *m, "--bars", 1, "--prompt-bars", "two"], "--prompt-bars"),
    ]


def test_bad_input_one_line_error_and_nothing_written(run_cli, tiny_checkpoint, examples, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    os.chdir(work)
    for args, message in _bad_cases(tmp_path, examples, tiny_checkpoint):
        before = sorted(p.name for p in work.iterdir())
        code, out, err = run_cli(*args, *([] if "-o" in args else ["-o", work / "out.mid"]))
        assert code != 0, (args, err)
        lines = [line for line in err.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), (args, err)
        assert message in lines[0], (args, lines[0])
        assert "Traceback" not in err
        assert sorted(p.name for p in work.iterdir()) == before, f"{args} wrote a file"
    assert (tmp_path / "exists.mid").read_bytes() == b"keep me"


def test_unwritable_output_folder(run_cli, tiny_checkpoint, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root can write into read-only folders")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    code, _, err = run_cli("generate", "--model", tiny_checkpoint, "--length", 10, "-o", ro / "x.mid")
    assert code == 1 and "not writable" in err


def _wait_for_cpu_seconds(pid: int, seconds: float, timeout: float) -> None:
    """Until the process has run `seconds` (CPU time, from /proc; wall time where there is none)."""
    stat = Path(f"/proc/{pid}/stat")
    if not stat.exists():
        time.sleep(seconds)
        return
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        if (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") >= seconds:  # utime + stime
            return
        time.sleep(0.5)


def test_ctrl_c_writes_what_was_generated(tiny_checkpoint, tmp_path):
    out = tmp_path / "long.mid"
    proc = subprocess.Popen([sys.executable, "-m", "spemusic", "generate", "--model", str(tiny_checkpoint),
                             "--length", "1000000", "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    # wait until sampling has produced a few bars: 12 s on an idle machine; on a busy one, until the
    # process has had the CPU time it needs there (start-up, then some sampling)
    _wait_for_cpu_seconds(proc.pid, 12.0, timeout=180)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert out.is_file()
    from spemusic.tokens.tokenizer import REMITokenizer

    tok = REMITokenizer()
    ids = tok.encode(out)
    assert REMIGrammar(tok).is_valid(ids) and np.count_nonzero(ids == tok.bar_id) >= 1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_output_folder_with_trailing_slash(run_cli, tiny_checkpoint, tmp_path):
    folder = tmp_path / "sketches"
    code, _, err = run_cli("generate", "--model", tiny_checkpoint, "--bars", 1, "--num", 2, "-o", f"{folder}/")
    assert code == 0, err
    assert sorted(p.name for p in folder.iterdir()) == ["piece-1.mid", "piece-2.mid"]


def test_a_piece_without_notes_is_an_error_and_nothing_is_written(run_cli, tiny_checkpoint, tmp_path):
    code, _, err = run_cli("generate", "--model", tiny_checkpoint, "--length", 3, "-o", tmp_path / "x.mid")
    assert code == 1 and "holds no note" in err and "nothing written" in err and not (tmp_path / "x.mid").exists()
    code, _, err = run_cli("generate", "--model", tiny_checkpoint, "--length", 30, "-o", tmp_path / "z.txt")
    assert code == 1 and "name it .mid" in err and not (tmp_path / "z.txt").exists()


def test_tokenize_with_every_file_skipped_fails(run_cli, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("a.mid", "b.mid"):
        (bad / name).write_bytes(b"junk")
    code, _, err = run_cli("tokenize", bad, "-o", tmp_path / "out/")
    assert code == 1 and "0 of 2 files written" in err


def test_continue_reports_prompt_and_new_bars(run_cli, tiny_checkpoint, examples, tmp_path):
    from spemusic.generation.prompts import count_bars, load_prompt
    from spemusic.tokens.tokenizer import REMITokenizer

    prompt_bars = count_bars(load_prompt(examples["piano"], REMITokenizer()).ids, REMITokenizer())
    code, out, _ = run_cli("continue", examples["piano"], "--model", tiny_checkpoint, "--bars", 2, "--json",
                           "-o", tmp_path / "a.mid")
    record = json.loads(out)
    assert code == 0 and record["new_bars"] == 2 and record["bars"] == prompt_bars + 2
    code, out, _ = run_cli("continue", examples["piano"], "--model", tiny_checkpoint, "--bars", 2, "--json",
                           "--only-continuation", "-o", tmp_path / "b.mid")
    record = json.loads(out)
    assert code == 0 and record["new_bars"] == record["bars"] == 2


def _write_midi(path: Path, instruments: list, meter: tuple[int, int], bpm: float) -> None:
    """A test file at 480 ticks per beat with one tempo and one time signature."""
    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    midi.instruments += instruments
    midi.tempo_changes.append(miditoolkit.TempoChange(bpm, 0))
    midi.time_signature_changes.append(miditoolkit.TimeSignature(*meter, 0))
    midi.dump(str(path))


def _pedalled_piano(path: Path) -> None:
    """Four 4/4 bars of piano, the sustain pedal pressed in every bar and still down at bar 3, and strings."""
    piano = miditoolkit.Instrument(program=0, name="piano")
    bar = 4 * 480
    for b in range(4):
        piano.notes += [miditoolkit.Note(80, 60 + b, b * bar, b * bar + 960),
                        miditoolkit.Note(70, 64 + b, b * bar + 960, b * bar + 1920)]
        piano.control_changes += [miditoolkit.ControlChange(64, 127, b * bar + 10),
                                  miditoolkit.ControlChange(64, 0, b * bar + (bar + 100 if b == 1 else 1800))]
    # a second track pedalled only in bars 3-4: cut off, it has no controllers left at all (miditoolkit
    # then writes its `pedals` spans instead, which must be cut too)
    strings = miditoolkit.Instrument(program=48, name="strings")
    strings.notes = [miditoolkit.Note(60, 48, b * bar, b * bar + bar) for b in range(4)]
    strings.control_changes = [miditoolkit.ControlChange(64, v, b * bar + t) for b in (2, 3) for v, t in ((127, 5), (0, 900))]
    _write_midi(path, [piano, strings], (4, 4), bpm=100)


def test_prompt_bars_keep_only_those_bars_controllers(run_cli, tiny_checkpoint, tmp_path):
    import pretty_midi

    src = tmp_path / "pedal.mid"
    _pedalled_piano(src)
    out = tmp_path / "out.mid"
    code, _, err = run_cli("continue", src, "--model", tiny_checkpoint, "--prompt-bars", 2, "--bars", 1, "-o", out)
    assert code == 0, err
    cut = 2 * 4 * 480
    got = miditoolkit.MidiFile(str(out))
    ccs = [(c.time, c.value) for i in got.instruments for c in i.control_changes if c.number == 64]
    assert ccs and max(t for t, _ in ccs) <= cut
    assert (cut, 0) in ccs  # the pedal held across the cut is released where the new bar begins
    last_note = max(n.end for i in got.instruments for n in i.notes)
    # the file ends with its notes, not with the source's later pedal moves
    assert pretty_midi.PrettyMIDI(str(out)).get_end_time() == pytest.approx(got.get_tick_to_time_mapping()[last_note])


def _nine_four(path: Path) -> None:
    """Two bars of 9/4 piano: a meter outside the token vocabulary."""
    piano = miditoolkit.Instrument(program=0)
    piano.notes = [miditoolkit.Note(80, 60 + k % 9, k * 480, k * 480 + 400) for k in range(18)]
    _write_midi(path, [piano], (9, 4), bpm=120)


def test_prompt_meter_outside_the_vocabulary_is_said_and_marked(run_cli, tiny_checkpoint, tmp_path):
    from spemusic.generation.prompts import load_prompt, merge_continuation
    from spemusic.tokens.tokenizer import REMITokenizer

    src = tmp_path / "nine.mid"
    _nine_four(src)
    code, _, err = run_cli("continue", src, "--model", tiny_checkpoint, "--bars", 1, "-o", tmp_path / "out.mid")
    assert code == 0 and "9/4 is outside the vocabulary" in err and "8/4" in err
    # a continuation that keeps the model's meter (no TimeSig token in its bar): the new bars, after
    # the prompt's three 8/4 bars as the model read them, are still marked 8/4, not left under 9/4
    tok = REMITokenizer()
    prompt = load_prompt(src, tok)
    new_bar = tok.tokens_to_ids(["Bar", "Position_0", "Program_0", "Pitch_60", "Velocity_19", "Duration_9", "EOS"])
    got = merge_continuation(prompt, np.concatenate([prompt.ids, new_bar]), tok)
    meters = [(t.numerator, t.denominator, t.time) for t in got.time_signature_changes]
    assert meters == [(9, 4, 0), (8, 4, 3 * 8 * 480)]
    assert max(n.start for n in got.instruments[0].notes) == 3 * 8 * 480


def test_a_piece_from_scratch_opens_on_a_note(tiny_checkpoint):
    model, tok = load_model(tiny_checkpoint)
    prime, step = model.prime, model.step

    def favour_bar(logits):  # a model that would rather open empty bars than play
        logits[..., tok.bar_id] += 30.0
        return logits

    model.prime = lambda ids, **kw: (lambda out: (favour_bar(out[0]), out[1]))(prime(ids, **kw))
    model.step = lambda state, ids: (lambda out: (favour_bar(out[0]), out[1]))(step(state, ids))
    for seed in range(3):
        names = tok.ids_to_tokens(sample(model, tok, num=2, length=60, seed=seed).ids[1])
        first_note = next(i for i, t in enumerate(names) if t.startswith("Position"))
        assert names[:first_note].count("Bar") == 1, names[:first_note]


def test_a_piece_rests_at_most_eight_bars_in_a_row(tiny_checkpoint):
    """A model that would rather write empty bars than play still plays after MAX_QUIET_BARS of
    them (a continuation of a silent intro once wrote 200 bars of chords alone)."""
    from spemusic.generation.sampling import MAX_QUIET_BARS

    model, tok = load_model(tiny_checkpoint)
    prime, step = model.prime, model.step

    def favour_bar(logits):
        logits[..., tok.bar_id] += 30.0
        return logits

    model.prime = lambda ids, **kw: (lambda out: (favour_bar(out[0]), out[1]))(prime(ids, **kw))
    model.step = lambda state, ids: (lambda out: (favour_bar(out[0]), out[1]))(step(state, ids))
    for ids in sample(model, tok, num=2, length=80, seed=0).ids:
        bars = " ".join(tok.ids_to_tokens(ids)).split("Bar")[1:]
        played = [i for i, bar in enumerate(bars) if "Pitch" in bar]
        assert len(played) >= 3 and max(np.diff(played)) == MAX_QUIET_BARS + 1, played


def test_a_first_bar_holding_only_a_chord_is_no_opening():
    """A chord change may stand without a note, but not as the whole first bar of a piece from
    scratch (pop-piano once opened on a chord and 22 empty bars)."""
    from spemusic.generation.sampling import next_token_mask
    from spemusic.tokens.grammar import GrammarState, REMIGrammar
    from spemusic.tokens.tokenizer import REMITokenizer, TokenizerConfig

    tok = REMITokenizer(TokenizerConfig(chords=True))
    grammar = REMIGrammar(tok)
    st = GrammarState()
    for name in ("BOS", "Bar", "TimeSig_4/4", "Position_0", "Chord_A:min", "Tempo_10"):
        grammar.advance(st, tok.vocab.index(name))
    assert grammar.allowed(st)[tok.bar_id]  # the grammar allows it ...
    assert not next_token_mask(grammar, st, None, from_scratch=True)[tok.bar_id]  # ... the opening does not
    assert next_token_mask(grammar, st, None, from_scratch=False)[tok.bar_id]
    # nor the end of a --bars piece: its last Position holds a note, as the grammar's EOS asks
    assert not next_token_mask(grammar, st, None, from_scratch=False, closing=True)[tok.bar_id]
    for name in ("Program_0", "Pitch_60", "Velocity_10", "Duration_3"):
        grammar.advance(st, tok.vocab.index(name))
    assert next_token_mask(grammar, st, None, from_scratch=False, closing=True)[tok.bar_id]


def test_a_piece_from_scratch_opens_in_its_most_likely_meter(tiny_checkpoint):
    """No sampled pickup bar: the opening TimeSig is the model's most likely one, whatever the seed."""
    model, tok = load_model(tiny_checkpoint)
    step = model.step
    three_four = tok.token_to_id["TimeSig_3/4"]

    def prefer_three_four(out):  # a model a little more sure of 3/4 than of anything else
        logits, state = out
        logits[..., three_four] = logits[..., tok.range("TimeSig")[0]:tok.range("TimeSig")[1]].max(-1).values + 0.5
        return logits, state

    model.step = lambda state, ids: prefer_three_four(step(state, ids))  # the TimeSig follows the first Bar
    for seed in range(4):
        for ids in sample(model, tok, num=2, length=12, seed=seed).ids:
            assert tok.ids_to_tokens(ids)[2] == "TimeSig_3/4"


def test_without_seed_every_run_is_new_and_can_be_made_again(run_cli, tiny_checkpoint, tmp_path):
    import re

    code, _, err = run_cli("generate", "--model", tiny_checkpoint, "--length", 200, "-o", tmp_path / "a.mid")
    assert code == 0, err
    seeds = [int(re.search(r"seed (\d+)", err).group(1))]  # the wrote line says which
    code, out, err = run_cli("generate", "--model", tiny_checkpoint, "--length", 200, "-o", tmp_path / "b.mid", "--json")
    assert code == 0, err
    seeds.append(json.loads(out.strip().splitlines()[-1])["seed"])
    assert seeds[0] != seeds[1] and (tmp_path / "a.mid").read_bytes() != (tmp_path / "b.mid").read_bytes()
    code, _, _ = run_cli("generate", "--model", tiny_checkpoint, "--length", 200, "-o", tmp_path / "again.mid",
                         "--seed", seeds[0])
    assert code == 0 and (tmp_path / "again.mid").read_bytes() == (tmp_path / "a.mid").read_bytes()


def test_meter_and_tempo_open_the_piece(run_cli, tiny_checkpoint, tmp_path):
    from spemusic.tokens.tokenizer import REMITokenizer

    tok = REMITokenizer()
    for seed in (1, 2):
        out = tmp_path / f"m{seed}.mid"
        code, _, err = run_cli("generate", "--model", tiny_checkpoint, "--bars", 2, "--meter", "3/4", "--tempo", 90,
                               "--seed", seed, "-o", out)
        assert code == 0, err
        names = tok.ids_to_tokens(tok.encode(out))
        assert names[2] == "TimeSig_3/4"
        first_tempo = next(n for n in names if n.startswith("Tempo_"))
        assert abs(tok.tempo_values[int(first_tempo.split("_")[1])] - 90) < 4
    for args, message in ((["--meter", "9/7"], "it has 2/2, 3/2"), (["--meter", "waltz"], "not in this model's"),
                          (["--tempo", 500], "from 30 to 300 BPM")):
        code, _, err = run_cli("generate", "--model", tiny_checkpoint, "--bars", 2, "-o", tmp_path / "x.mid", *args)
        assert code == 1 and message in err and not (tmp_path / "x.mid").exists(), err


def test_threads_option(run_cli, tiny_checkpoint, tmp_path):
    import torch

    code, _, err = run_cli("generate", "--model", tiny_checkpoint, "--length", 60, "--threads", 2, "--num", 1,
                           "-o", tmp_path / "a.mid")
    assert code == 0 and torch.get_num_threads() == 2, err
    # without --threads (nor OMP_NUM_THREADS), one thread at any --num (benchmarks/threads.py)
    import os

    env = os.environ.pop("OMP_NUM_THREADS", None)
    try:
        code, _, err = run_cli("generate", "--model", tiny_checkpoint, "--length", 60, "--num", 4, "-o", tmp_path / "c.mid")
    finally:
        if env is not None:
            os.environ["OMP_NUM_THREADS"] = env
    assert code == 0 and torch.get_num_threads() == 1, err
    code, _, err = run_cli("generate", "--model", tiny_checkpoint, "--length", 60, "--threads", 0, "-o", tmp_path / "b.mid")
    assert code == 1 and "--threads must be at least 1" in err and not (tmp_path / "b.mid").exists()


@pytest.mark.parametrize("args,message", [
    (["--temperature", "1e-300"], "between 0.001 and 1000"), (["--temperature", "nan"], "between 0.001 and 1000"),
    (["--seed", str(2**64)], "2^63"), (["--seed", "-1"], "2^63"), (["--num", "100000"], "between 1 and 256"),
    (["--chord-strength", "-1"], "--chord-strength"), (["--repeat", "1.5"], "--repeat must be between 0"),
    (["--repeat", "-0.1"], "--repeat must be between 0"), (["--onset-top-p", "0"], "--onset-top-p must be in"),
    (["--hole-penalty", "-1"], "--hole-penalty must be between 0"), (["--hole-penalty", "nan"], "--hole-penalty must"),
    (["--stacking", "0"], "--stacking must be in (0, 10]"),
])
def test_out_of_range_sampling_options(run_cli, tiny_checkpoint, tmp_path, args, message):
    code, _, err = run_cli("generate", "--model", tiny_checkpoint, "--length", 20, "-o", tmp_path / "x.mid", *args)
    assert code == 1 and message in err and not (tmp_path / "x.mid").exists(), err


def test_sampling_defaults_follow_the_model():
    from spemusic.generation.sampling import SamplingOptions

    pop = SamplingOptions.for_model("pop-piano")
    groove = SamplingOptions.for_model("groove")
    mine = SamplingOptions.for_model(None, top_p=0.9, bar_top_p=None)
    assert (pop.top_p, pop.bar_top_p) == (1.0, 0.8)
    assert (groove.top_p, groove.bar_top_p) == (0.8, 0.8)
    assert (mine.top_p, mine.bar_top_p) == (0.9, 0.8)  # what the user gives wins
    # the cache and the onset nucleus where they were measured
    assert (pop.repeat, pop.onset_top_p, pop.hole_penalty, pop.stacking) == (0.0, 0.9, 4.0, 0.8)
    assert (pop.follow_repeats, groove.follow_repeats, mine.follow_repeats) == (6.0, 0.0, 0.0)
    assert (groove.repeat, groove.onset_top_p, groove.hole_penalty, groove.stacking) == (0.0, 1.0, 0.0, 1.0)
    assert (mine.repeat, mine.onset_top_p, mine.hole_penalty, mine.stacking) == (0.0, 1.0, 0.0, 1.0)
    assert SamplingOptions.for_model("pop-piano", repeat=0.0).repeat == 0.0


def test_sampling_keeps_to_the_vocabulary_seen_in_training(tiny_checkpoint, examples):
    """A token the model never saw in training (another instrument's Program) is never drawn;
    where only unseen tokens fit (a prompt's instrument the model never saw), the grammar decides."""
    from spemusic.generation.sampling import within_training

    model, tok = load_model(tiny_checkpoint)
    assert model.trained_tokens is None  # a checkpoint that does not record it: no restriction
    lo, hi = tok.range("Program")
    trained = np.ones(len(tok), dtype=bool)
    trained[lo:hi] = False
    trained[lo] = True  # Program_0 alone
    model.trained_tokens = trained
    ids = sample(model, tok, num=4, length=256, seed=3).ids
    programs = {int(t) for s in ids for t in s if lo <= t < hi}
    assert programs == {lo}
    grammar_only = np.zeros(len(tok), dtype=bool)
    grammar_only[lo + 1] = True
    assert within_training(grammar_only, trained).tolist() == grammar_only.tolist()
    assert within_training(trained, None) is trained


def test_training_records_its_vocabulary():
    """trained_vocabulary: what the songs hold, widened by the sampler's transpositions."""
    from spemusic import REMITokenizer
    from spemusic.training.data import trained_vocabulary

    class Cache:  # the two things trained_vocabulary reads
        tokenizer = REMITokenizer()

        @staticmethod
        def sequences(split):
            tok = Cache.tokenizer
            return [tok.tokens_to_ids(["BOS", "Bar", "Position_0", "Program_0", "Pitch_60", "Velocity_20", "Duration_5", "EOS"])]

    tok = Cache.tokenizer
    ids = set(trained_vocabulary(Cache, 2))
    names = {tok.ids_to_tokens([i])[0] for i in ids}
    assert {f"Pitch_{p}" for p in range(58, 63)} <= names and "Pitch_57" not in names and "Pitch_63" not in names
    assert "Program_0" in names and "Program_1" not in names and "Bar" in names


def test_discourage_holes_moves_the_next_onset_closer_and_keeps_its_total():
    """Onsets that would leave silence are penalised by its length; the onsets' total (against
    another note at this onset) is kept, and pieces not choosing an onset are untouched."""
    from spemusic.generation.sampling import discourage_holes, log_sum_exp
    from spemusic.tokens.grammar import NOTE_END, PITCH, GrammarState

    onsets = np.arange(10, 10 + 49)  # Position_0 … Position_47, then the bar line
    after_note = GrammarState(last=NOTE_END, pos=0, bar_len=48, sounding=12)  # sounds for one beat
    mid_note = GrammarState(last=PITCH, pos=0, bar_len=48, sounding=12)
    logits = np.random.default_rng(0).standard_normal((2, 80)).astype(np.float32)
    out = discourage_holes(logits, [after_note, mid_note], 4.0, onsets, beat=12)
    assert np.array_equal(out[1], logits[1]) and np.array_equal(out[0, :10], logits[0, :10])
    assert np.allclose(log_sum_exp(out[0, onsets]), log_sum_exp(logits[0, onsets]))
    shift = out[0, onsets] - logits[0, onsets]
    assert np.allclose(shift[:16], shift[0])  # up to a quarter beat after the sound ends: free
    assert np.isclose(shift[15] - shift[27], 4.0)  # one beat further: 4 nats less
    assert np.isclose(shift[15] - shift[-1], 4.0 * 33 / 12)  # the bar line, 33 steps further
    assert np.array_equal(discourage_holes(logits, [after_note, mid_note], 0.0, onsets, beat=12), logits)


def test_a_large_hole_penalty_leaves_no_hole(shared_data):
    """With --hole-penalty at its largest, the default model's pieces fall silent for more than a
    quarter beat only where the penalty cannot see it coming: melody first, a bar without melody
    whose first onset (chosen before the model says which part plays it) comes late. Without the
    penalty, the same seeds leave more silence."""
    from spemusic.generation.sampling import SamplingOptions, sample
    from spemusic.music.metrics import note_grid, sounding
    from spemusic.nn.checkpoint import load_model

    model, tok = load_model("pop-piano")
    melody = tok.part_id("melody")

    def holes(penalty: float) -> tuple[int, list[tuple[np.ndarray, int]]]:
        """(steps in holes longer than a quarter beat, [(grid, step where such a hole ends)])."""
        steps, ends = 0, []
        for ids in sample(model, tok, num=4, length=400, seed=4, options=SamplingOptions(hole_penalty=penalty)).ids:
            grid = note_grid(ids, tok)
            lo = grid.onset.min()
            silent = np.r_[0, (~sounding(grid)[lo:(grid.onset + grid.dur).max()]).astype(int), 0]
            starts, stops = np.flatnonzero(np.diff(silent) == 1), np.flatnonzero(np.diff(silent) == -1)
            long = stops - starts > 3  # a quarter beat, 12 steps a beat
            steps += int((stops - starts)[long].sum())
            ends += [(grid, int(e) + lo) for e in stops[long]]
        return steps, ends

    with_penalty, ends = holes(100.0)
    for grid, end in ends:
        bar = int(np.searchsorted(grid.bar_start, end, side="right")) - 1
        in_bar = grid.bar == bar
        assert end == grid.onset[in_bar].min() and not (grid.prog[in_bar] == melody).any()
    assert with_penalty < holes(0.0)[0]


def test_temper_stacking_scales_the_odds_of_one_more_note():
    """Once an onset holds two notes, the odds of one more note (its Program tokens against the
    rest) are multiplied by the scale; an onset with one note, and a piece mid-note, are untouched."""
    from spemusic.generation.sampling import softmax, temper_stacking
    from spemusic.tokens.grammar import NOTE_END, PITCH, GrammarState

    programs = slice(20, 30)
    two = GrammarState(last=NOTE_END, notes_here=2)
    one = GrammarState(last=NOTE_END, notes_here=1)
    mid = GrammarState(last=PITCH, notes_here=3)
    logits = np.random.default_rng(0).standard_normal((3, 60)).astype(np.float32)
    out = temper_stacking(logits, [two, one, mid], 0.5, programs)
    assert np.array_equal(out[1:], logits[1:])

    def odds(row):
        p = softmax(row)[programs].sum()
        return p / (1 - p)

    assert np.isclose(odds(out[0]), 0.5 * odds(logits[0]))
    assert np.array_equal(temper_stacking(logits, [two, one, mid], 1.0, programs), logits)


def test_meter_holds_for_the_whole_piece_and_tempo_is_written_exactly(run_cli, tmp_path):
    """--meter 3/4 over 16 bars: every bar in 3/4 (the model leans to 4/4 and may not switch);
    --tempo 90: the file opens at 90 BPM exactly, not at its token bin's 91.4."""
    out = tmp_path / "waltz.mid"
    code, _, err = run_cli("generate", "--meter", "3/4", "--tempo", 90, "--bars", 16, "--num", 3, "--seed", 5,
                           "-o", out)
    assert code == 0, err
    for i in (1, 2, 3):
        midi = miditoolkit.MidiFile(str(tmp_path / f"waltz-{i}.mid"))
        assert {(t.numerator, t.denominator) for t in midi.time_signature_changes} == {(3, 4)}
        assert midi.tempo_changes[0].tempo == pytest.approx(90.0, abs=1e-3)  # MIDI keeps whole microseconds
        onsets = [n.start for inst in midi.instruments for n in inst.notes]
        assert max(onsets) < 16 * 3 * midi.ticks_per_beat  # 16 bars of three beats
    # the rule itself: after any later bar line, no time signature may be written
    from spemusic import load_model
    from spemusic.generation.sampling import _Steering
    from spemusic.tokens.grammar import GrammarState, REMIGrammar

    _, tok = load_model("pop-piano")
    grammar = REMIGrammar(tok)
    steer = _Steering.of(tok, grammar, None, None, 0.0, "3/4", None, None)
    st = GrammarState()
    for t in tok.tokens_to_ids(["BOS", "Bar", "TimeSig_3/4", "Position_0", "Tempo_10", "Program_piano", "Pitch_60",
                                "Velocity_20", "Duration_12", "Bar"]):
        grammar.advance(st, t)
    lo, hi = tok.range("TimeSig")
    assert grammar.allowed(st)[lo:hi].any() and not steer.mask(st, 2, True)[lo:hi].any()


@pytest.mark.parametrize("name", ["pop-piano", "groove"])
def test_the_library_makes_the_music_the_command_makes(run_cli, tmp_path, name):
    """spemusic.generation.pieces.generate with a shipped model and no options samples with generate's own
    defaults for it: the same seed gives the same bytes."""
    from spemusic import load_model
    from spemusic.generation.pieces import generate

    code, _, err = run_cli("generate", "--model", name, "--bars", 2, "--seed", 3, "-o", tmp_path / "cli.mid")
    assert code == 0, err
    model, tok = load_model(name)
    generate(model, tok, bars=2, seed=3).midis[0].dump(str(tmp_path / "lib.mid"))
    assert (tmp_path / "lib.mid").read_bytes() == (tmp_path / "cli.mid").read_bytes()
    assert miditoolkit.MidiFile(str(tmp_path / "cli.mid")).instruments[0].notes


def test_a_checkpoint_carries_its_own_sampling_defaults(run_cli, tiny_checkpoint, tmp_path):
    """Sampling defaults recorded in a checkpoint (release --sampling) are the ones generate and
    spemusic.generation.pieces sample it with; a record that is not theirs is one line."""
    import json

    import safetensors

    from spemusic import load_model
    from spemusic.generation.pieces import generate
    from spemusic.generation.sampling import SamplingOptions
    from spemusic.nn.checkpoint import WEIGHTS, write_weights
    from spemusic.options import SAMPLING_DEFAULTS

    model, tok = load_model(tiny_checkpoint)
    with safetensors.safe_open(str(tiny_checkpoint / WEIGHTS), "pt") as f:
        info = json.loads(f.metadata()["info"])
    for folder, record in (("own", {"top_p": 0.5, "stacking": 0.7}), ("bad", {"top_q": 0.5})):
        (tmp_path / folder).mkdir()
        write_weights(tmp_path / folder / WEIGHTS, model, tok.config, {**info, "name": "mine", "sampling": record})
    mine, tok = load_model(tmp_path / "own")
    assert mine.sampling_defaults == {"top_p": 0.5, "stacking": 0.7}
    options = SamplingOptions.for_model(mine.release_name, own=mine.sampling_defaults)
    assert (options.top_p, options.stacking, options.bar_top_p) == (0.5, 0.7, SAMPLING_DEFAULTS["bar_top_p"])
    code, _, err = run_cli("generate", "--model", tmp_path / "own", "--length", 64, "--seed", 1, "-o", tmp_path / "cli.mid")
    assert code == 0, err
    generate(mine, tok, length=64, seed=1).midis[0].dump(str(tmp_path / "lib.mid"))
    assert (tmp_path / "lib.mid").read_bytes() == (tmp_path / "cli.mid").read_bytes()
    generate(mine, tok, length=64, seed=1, options=SamplingOptions()).midis[0].dump(str(tmp_path / "plain.mid"))
    assert (tmp_path / "plain.mid").read_bytes() != (tmp_path / "lib.mid").read_bytes()  # they were used
    code, _, err = run_cli("generate", "--model", tmp_path / "bad", "--length", 8, "-o", tmp_path / "x.mid")
    assert code == 1 and "its sampling defaults are not" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "x.mid").exists()


def test_release_reads_sampling_defaults_as_key_value_pairs():
    import argparse

    from spemusic.training.release import _sampling_flag

    assert _sampling_flag("top_p=0.8,bar_top_p=0.75") == {"top_p": 0.8, "bar_top_p": 0.75}
    for bad in ("top_q=0.8", "top_p", "top_p=high"):
        with pytest.raises(argparse.ArgumentTypeError):
            _sampling_flag(bad)


def test_one_generation_config_makes_what_each_command_makes(run_cli, tmp_path):
    """A GenerationConfig given to generate, continue_prompt and accompany makes the bytes the
    commands make with the same settings (chords, meter, tempo, seed; the model's defaults);
    play: tests/test_play.py."""
    from spemusic import load_model
    from spemusic.generation.accompany import load_melody
    from spemusic.generation.pieces import accompany, continue_prompt, generate
    from spemusic.generation.prompts import load_prompt
    from spemusic.generation.settings import GenerationConfig
    from spemusic.tokens.chords import parse_chords

    examples = Path(__file__).resolve().parents[1] / "data" / "examples"
    pop, tok = load_model("pop-piano")
    runs = [(["generate", "--bars", 2, "--seed", 4, "--chords", "C G", "--meter", "4/4", "--tempo", 100],
             lambda: generate(pop, tok, GenerationConfig(bars=2, seed=4, chords=parse_chords("C G"), meter="4/4",
                                                         tempo=100.0)).midis[0]),
            (["accompany", examples / "melody.mid", "--seed", 5],
             lambda: accompany(pop, tok, load_melody(examples / "melody.mid", tok),
                               GenerationConfig(seed=5)).midis[0])]
    drums, drum_tok = load_model("groove")
    runs.append((["continue", examples / "groove.mid", "--bars", 2, "--seed", 6],
                 lambda: continue_prompt(drums, drum_tok, load_prompt(examples / "groove.mid", drum_tok),
                                         GenerationConfig(bars=2, seed=6)).midis[0]))
    for i, (args, library) in enumerate(runs):
        code, _, err = run_cli(*args, "-o", tmp_path / f"cli{i}.mid")
        assert code == 0, err
        library().dump(str(tmp_path / f"lib{i}.mid"))
        assert (tmp_path / f"lib{i}.mid").read_bytes() == (tmp_path / f"cli{i}.mid").read_bytes(), args



def test_generation_config_errors_name_the_setting():
    from spemusic.errors import OptionError
    from spemusic.generation.settings import GenerationConfig

    with pytest.raises(OptionError, match="num must be between 1 and 256"):
        GenerationConfig(num=0, bars=1).check()
    with pytest.raises(OptionError, match="chord_strength must be between 0 and 100"):
        GenerationConfig(bars=1, chord_strength=float("nan")).check()
    with pytest.raises(OptionError, match="key and chords: give one"):
        GenerationConfig(bars=1, key=(0, "major"), chords=("C:maj",)).check()
    with pytest.raises(TypeError, match="unknown generation setting"):
        GenerationConfig.of(None, bar=4)
