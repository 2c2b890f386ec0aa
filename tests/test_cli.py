"""The command line: help and version, tokenize/detokenize, data prepare, bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import symusic

import spemusic
from spemusic.errors import SpemusicError
from spemusic.tokens.tokenizer import REMITokenizer, TokenizerConfig
from spemusic.training.data import TokenCache, WindowSampler, default_cache_dir, fixed_windows, prepare, swap_kit

COMMANDS = ["tokenize", "detokenize", "data", "train", "generate", "continue", "models", "eval"]


def test_help_lists_every_command_and_version(run_cli):
    code, out, _ = run_cli("--help")
    assert code == 0
    for c in COMMANDS:
        assert c in out
    for c in ["tokenize", "detokenize", "train", "generate", "continue", "eval"]:
        code, out, _ = run_cli(c, "--help")
        assert code == 0 and "Example" in out, c
    code, out, _ = run_cli("data", "prepare", "--help")
    assert code == 0 and "Example" in out
    code, out, _ = run_cli("--version")
    assert code == 0 and out.strip() == f"spemusic {spemusic.__version__}"


def test_token_files_say_what_the_bins_mean_and_old_files_still_read(run_cli, examples, tmp_path):
    txt = tmp_path / "piano.txt"
    assert run_cli("tokenize", examples["piano"], "-o", txt)[0] == 0
    lines = txt.read_text().splitlines()
    assert "Position_0       ; beat 1" in lines and "Pitch_48         ; C3" in lines
    assert any(line.startswith("Tempo_") and line.endswith(" BPM") for line in lines)
    assert any(line.startswith("Duration_") and line.endswith(" beat") for line in lines)
    bare = tmp_path / "bare.txt"  # a token file as written before the meanings: one token per line
    bare.write_text("\n".join(line.split()[0] for line in lines) + "\n")
    for src in (txt, bare):
        assert run_cli("detokenize", src, "-o", tmp_path / f"{src.stem}.mid")[0] == 0
    assert (tmp_path / "piano.mid").read_bytes() == (tmp_path / "bare.mid").read_bytes()
    tok = REMITokenizer()
    assert tok.describe(tok.token_to_id["Position_15"]) == "beat 2 + 1/4"
    assert tok.describe(tok.token_to_id["Bar"]) == ""


def test_tokenize_detokenize_round_trip(run_cli, examples, tmp_path):
    txt, mid = tmp_path / "piano.txt", tmp_path / "again.mid"
    assert run_cli("tokenize", examples["piano"], "-o", txt)[0] == 0
    lines = txt.read_text().split()
    assert lines[:3] == ["BOS", "Bar", "TimeSig_4/4"] and lines[-1] == "EOS"
    assert run_cli("detokenize", txt, "-o", mid)[0] == 0
    tok = REMITokenizer()
    assert np.array_equal(tok.encode(mid), tok.encode(examples["piano"]))


def _bad_files(folder: Path, examples) -> dict[str, Path]:
    files = {"empty": folder / "empty.mid", "garbage": folder / "garbage.mid", "truncated": folder / "truncated.mid",
             "noteless": folder / "noteless.mid"}
    files["empty"].write_bytes(b"")
    files["garbage"].write_bytes(b"%PDF-1.4 not music " * 20)
    files["truncated"].write_bytes(examples["groove"].read_bytes()[:70])
    import miditoolkit

    miditoolkit.MidiFile(ticks_per_beat=96).dump(str(files["noteless"]))
    return files


@pytest.mark.parametrize("kind,message", [("empty", "empty file"), ("garbage", "not a MIDI file"),
                                          ("truncated", "truncated.mid"), ("noteless", "no notes")])
def test_single_bad_file_is_one_line_error(run_cli, examples, tmp_path, kind, message):
    bad = _bad_files(tmp_path, examples)[kind]
    out = tmp_path / "out.txt"
    code, _, err = run_cli("tokenize", bad, "-o", out)
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and str(bad) in lines[0]
    assert not out.exists()


def test_folder_mode_skips_bad_files(run_cli, examples, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    _bad_files(src, examples)
    (src / "sub" / "GROOVE.MIDI").write_bytes(examples["groove"].read_bytes())
    (src / "piano.mid").write_bytes(examples["piano"].read_bytes())
    code, _, err = run_cli("tokenize", src, "-o", tmp_path / "tokens")
    assert code == 0, err
    assert sorted(p.relative_to(tmp_path / "tokens").as_posix() for p in (tmp_path / "tokens").rglob("*.txt")) == \
        ["piano.txt", "sub/GROOVE.txt"]
    assert err.count("skipped") >= 4 and "2 of 6 files written" in err
    code, _, err = run_cli("detokenize", tmp_path / "tokens", "-o", tmp_path / "midi")
    assert code == 0, err
    assert (tmp_path / "midi" / "sub" / "GROOVE.mid").is_file()


def test_detokenize_bad_tokens(run_cli, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("BOS\nBar\nNotAToken_3\n")
    code, _, err = run_cli("detokenize", bad, "-o", tmp_path / "x.mid")
    assert code == 1 and "NotAToken_3" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.mid").exists()
    code, _, err = run_cli("tokenize", tmp_path / "missing.mid")
    assert code == 1 and "no such file" in err


def test_detokenize_says_how_many_notes_it_cannot_form(run_cli, tmp_path):
    src = tmp_path / "cut.txt"  # the second note has no Velocity and Duration; one more after EOS
    src.write_text("BOS\nBar\nTimeSig_4/4\nPosition_0\nTempo_10\nProgram_0\nPitch_60 ; C4\nVelocity_20\n"
                   "Duration_3\nProgram_0\nPitch_62\n\nPosition_12\nProgram_0\nPitch_64\nVelocity_20\nDuration_3\n"
                   "EOS\nProgram_0\nPitch_67\nVelocity_20\nDuration_3\n")
    code, _, err = run_cli("detokenize", src, "-o", tmp_path / "cut.mid")
    assert code == 0, err
    assert ("2 of 4 notes could not be formed: skipped; the tokens first leave the REMI grammar at "
            "line 13 (Position_12)") in " ".join(err.split())
    assert sum(len(t.notes) for t in symusic.Score(str(tmp_path / "cut.mid")).tracks) == 2
    whole = tmp_path / "whole.txt"
    whole.write_text("BOS\nBar\nTimeSig_4/4\nPosition_0\nTempo_10\nProgram_0\nPitch_60\nVelocity_20\nDuration_3\nEOS\n")
    code, _, err = run_cli("detokenize", whole, "-o", tmp_path / "whole.mid")
    assert code == 0 and "could not be formed" not in err, err


def test_data_prepare_cache_reuse_and_summary(run_cli, examples, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"p{i}.mid").write_bytes(examples["piano" if i % 2 else "groove"].read_bytes())
    (src / "broken.mid").write_bytes(b"")
    code, out, err = run_cli("data", "prepare", src, "-o", tmp_path / "cache")
    assert code == 0, err
    assert "skipped files: 1" in out and "vocabulary coverage" in out and "tokens/file" in out
    index = json.loads((tmp_path / "cache" / "index.json").read_text())
    assert index["skipped"][0]["path"] == "broken.mid" and "empty" in index["skipped"][0]["reason"]
    assert sum(s["files"] for s in index["splits"].values()) == 6
    code, out, _ = run_cli("data", "prepare", src, "-o", tmp_path / "cache")
    assert code == 0 and "reused" in out
    # another tokenizer config never reuses (or overwrites) this cache
    with pytest.raises(SpemusicError, match="another tokenizer config"):
        prepare(src, tmp_path / "cache", TokenizerConfig(beat_resolution=8))
    assert default_cache_dir(src, TokenizerConfig()) != default_cache_dir(src, TokenizerConfig(beat_resolution=8))
    # a changed file is noticed
    (src / "p0.mid").write_bytes(examples["piano"].read_bytes() + b"")
    import os

    os.utime(src / "p0.mid", (1, 1))
    code, out, _ = run_cli("data", "prepare", src, "-o", tmp_path / "cache")
    assert code == 0 and "reused" not in out


def test_real_data_prepare_splits_and_windows(shared_data, tmp_path):
    cache, reused = prepare(shared_data / "groove", tmp_path / "groove")
    assert not reused
    counts = cache.index["splits"]
    assert counts["train"]["files"] == 897 and counts["valid"]["files"] == 124  # info.csv's split column
    sampler = WindowSampler(cache, "train", 256)
    batch = sampler.sample(np.random.default_rng(0), 16)
    tok = cache.tokenizer
    assert batch.shape == (16, 257)
    assert all(w[0] in (tok.bar_id, tok.bos_id) for w in batch)  # windows start at bar lines
    # a tenth start at a piece's beginning (generation from scratch starts there), plus the
    # piece starts among the uniformly drawn bar starts
    firsts = sampler.sample(np.random.default_rng(1), 4000)[:, 0]
    for windows in (sampler, WindowSampler(cache, "train", 256, piece_starts=0.5)):  # (train --piece-starts)
        firsts = windows.sample(np.random.default_rng(1), 4000)[:, 0]
        share = windows.piece_starts
        expected = share + (1 - share) * len(windows.sequences) / len(windows.starts)
        assert abs(np.mean(firsts == tok.bos_id) - expected) < 0.02
    valid = fixed_windows(cache, "valid", 256, max_windows=8)
    assert np.array_equal(valid, fixed_windows(TokenCache.load(tmp_path / "groove"), "valid", 256, max_windows=8))


def test_transposition_keeps_drums_and_range():
    tok = REMITokenizer()
    ids = tok.tokens_to_ids(["BOS", "Bar", "TimeSig_4/4", "Position_0", "Tempo_10",
                             "Program_0", "Pitch_125", "Velocity_20", "Duration_3",
                             "Program_drums", "Pitch_36", "Velocity_20", "EOS"])

    class FakeCache:
        path = Path(".")
        tokenizer = tok

        def sequences(self, split):
            return [ids]

    sampler = WindowSampler(FakeCache(), "train", 12)
    rng = np.random.default_rng(0)
    shifts = set()
    for _ in range(50):
        w = sampler.transpose(np.asarray(ids, dtype=np.int64), rng)
        tokens = tok.ids_to_tokens(w)
        assert tokens[10] == "Pitch_36"  # the drum note stays
        pitch = int(tokens[6].split("_")[1])
        assert 119 <= pitch <= 127
        shifts.add(pitch - 125)
    assert min(shifts) < 0 and max(shifts) == 2


def test_kit_swaps_exchange_drums_the_same_way_through_a_window_and_keep_the_note_order():
    tok = REMITokenizer()
    # hat and snare together (42 sorts after 38), ride and side stick later, a piano note between
    tokens = ["Bar", "TimeSig_4/4", "Position_0", "Tempo_10",
              "Program_0", "Pitch_60", "Velocity_20", "Duration_3",
              "Program_drums", "Pitch_38", "Velocity_20", "Program_drums", "Pitch_42", "Velocity_10",
              "Position_12", "Program_drums", "Pitch_37", "Velocity_5", "Program_drums", "Pitch_51", "Velocity_7",
              "Position_24", "Program_drums", "Pitch_36", "Velocity_9", "EOS"]
    ids = np.asarray(tok.tokens_to_ids(tokens), dtype=np.int64)
    seen = set()
    for seed in range(40):
        out = tok.ids_to_tokens(swap_kit(ids, tok, np.random.default_rng(seed)))
        assert out[:8] == tokens[:8] and out[-4:] == tokens[-4:]  # the piano note and the kick stay
        onsets = (out[8:14], out[15:21])
        for onset in onsets:  # each onset: two drum notes, pitch ascending, each with its own velocity
            pitches = [int(t.split("_")[1]) for t in onset[1::3]]
            assert onset[0::3] == ["Program_drums"] * 2 and pitches == sorted(pitches)
        notes = {(out[i], out[i + 1]) for i in (9, 12, 16, 19)}
        seen.add(frozenset(notes))
        hats_kept = ("Pitch_42", "Velocity_10") in notes
        assert hats_kept == (("Pitch_51", "Velocity_7") in notes)  # exchanged both ways or not at all
        assert (("Pitch_38", "Velocity_20") in notes) == (("Pitch_37", "Velocity_5") in notes)
    # hats and ride, snare and side stick, both, or only the crashes (none here)
    assert len(seen) == 4


def test_tokenize_and_detokenize_never_replace_a_file_silently(run_cli, examples, tmp_path):
    mid = tmp_path / "piano.mid"
    mid.write_bytes(examples["piano"].read_bytes())
    original = mid.read_bytes()
    assert run_cli("tokenize", mid)[0] == 0  # next to the input
    txt = tmp_path / "piano.txt"
    tokens = txt.read_text()
    code, _, err = run_cli("tokenize", mid)
    assert code == 1 and "already exists" in err and "--overwrite" in err
    # piano.txt -> piano.mid would replace the MIDI file it came from
    code, _, err = run_cli("detokenize", txt)
    assert code == 1 and "already exists" in err
    assert mid.read_bytes() == original and txt.read_text() == tokens
    assert run_cli("detokenize", txt, "--overwrite")[0] == 0
    assert REMITokenizer().encode(mid).tolist() == REMITokenizer().encode(examples["piano"]).tolist()
    # folder mode: all outputs are checked before any is written
    out = tmp_path / "tokens"
    assert run_cli("tokenize", examples["piano"], examples["groove"], "-o", out)[0] == 0
    (out / "piano.txt").write_text("mine")
    (out / "groove.txt").unlink()
    code, _, err = run_cli("tokenize", examples["piano"], examples["groove"], "-o", out)
    assert code == 1 and "1 of the 2 outputs already exist" in err
    assert (out / "piano.txt").read_text() == "mine" and not (out / "groove.txt").exists()
    assert run_cli("tokenize", examples["piano"], examples["groove"], "-o", out, "--overwrite")[0] == 0
    assert (out / "piano.txt").read_text().startswith("BOS")


def test_detokenize_says_where_tokens_break_the_grammar(run_cli, examples, tmp_path):
    txt = tmp_path / "piano.txt"
    assert run_cli("tokenize", examples["piano"], "-o", txt)[0] == 0
    lines = txt.read_text().splitlines()
    first_velocity = next(i for i, t in enumerate(lines) if t.startswith("Velocity_"))
    bad = tmp_path / "bad.txt"
    bad.write_text("\n".join(t for i, t in enumerate(lines) if i != first_velocity) + "\n")
    code, _, err = run_cli("detokenize", bad, "-o", tmp_path / "bad.mid")
    assert code == 0, err
    # the Duration that follows the missing Velocity is the first token out of place (1-based lines)
    token = lines[first_velocity + 1].split()[0]
    assert f"line {first_velocity + 1} ({token})" in err and "1 of " in err and "warning" in err
    assert len(REMITokenizer().decode(REMITokenizer().encode(tmp_path / "bad.mid")).instruments[0].notes) > 0
    code, _, err = run_cli("detokenize", txt, "-o", tmp_path / "good.mid")
    assert code == 0 and "warning" not in err


@pytest.mark.parametrize("args,message", [
    (["train", "--preset", "huge"], "--preset"),
    (["generate", "--length", "abc"], "--length"),
    (["generate", "--bogus"], "--bogus"),
    (["eval", "pop-piano", "x", "--max-pieces", "-1"], "--max-pieces"),
    (["continue"], "prompt"),
    (["no-such-command"], "no-such-command"),
])
def test_usage_errors_are_one_line(run_cli, args, message):
    code, out, err = run_cli(*args)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], err
    assert "--help" in lines[0] and "Traceback" not in err


def test_help_shows_defaults_and_takes_h(run_cli):
    code, out, _ = run_cli("train", "-h")
    flat = " ".join(out.replace("│", " ").split())
    # (rich may wrap a long choice list, its end before or after the help text: the default follows)
    assert code == 0 and re.search(r"Model size\. (\S+ )?\[default: (\S+ )?small\]", flat) and "[default: 1024]" in flat
    assert all(f"─ {panel} ─" in out for panel in ("Model", "Data", "Optimisation", "Run"))  # options in panels
    code, out, _ = run_cli("continue", "--help")
    assert code == 0 and "PROMPT-continued.mid" in " ".join(out.split()).replace("│", "")


def test_outputs_are_checked_before_the_work(run_cli, examples, tmp_path):
    code, _, err = run_cli("tokenize", examples["piano"], "-o", tmp_path / "nodir" / "x.txt")
    assert code == 1 and "folder" in err and "does not exist" in err and ".tmp" not in err
    code, _, err = run_cli("eval", "pop-piano", tmp_path, "--json", tmp_path / "nodir" / "x.json")
    assert code == 1 and "--json" in err and "does not exist" in err
    code, _, err = run_cli("eval", "pop-piano", tmp_path, "--plot", tmp_path / "x.jpg")
    assert code == 1 and ".png" in err
    code, _, err = run_cli("eval", "pop-piano", tmp_path, "--reference", tmp_path)
    assert code == 1 and "--metrics" in err
    a_file = tmp_path / "taken.mid"
    a_file.write_bytes(b"")
    code, _, err = run_cli("data", "prepare", tmp_path, "-o", a_file)
    assert code == 1 and "not a folder" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("data", "prepare", a_file, "-o", tmp_path / "c")
    assert code == 1 and "not a folder" in err and not (tmp_path / "c").exists()


def test_tokenize_into_a_new_folder_with_a_trailing_slash(run_cli, examples, tmp_path):
    code, _, err = run_cli("tokenize", examples["piano"], "-o", f"{tmp_path / 'tokens'}/")
    assert code == 0, err
    assert (tmp_path / "tokens" / "piano.txt").is_file()
    bad = tmp_path / "bad.mid"
    bad.write_bytes(b"not midi")
    code, _, err = run_cli("tokenize", bad, "-o", f"{tmp_path / 'never'}/")
    assert code == 1 and not (tmp_path / "never").exists()  # nothing made when the work fails


def test_doubled_notes_round_trip_without_a_warning(run_cli, tmp_path):
    import miditoolkit

    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    piano = miditoolkit.Instrument(program=0)
    # the same pitch twice at one onset (POP909 has such notes): the tokenizer keeps both
    piano.notes = [miditoolkit.Note(80, 60, 0, 960), miditoolkit.Note(70, 60, 0, 480), miditoolkit.Note(70, 64, 480, 960)]
    midi.instruments.append(piano)
    midi.dump(str(tmp_path / "doubled.mid"))
    assert run_cli("tokenize", tmp_path / "doubled.mid", "-o", tmp_path / "doubled.txt")[0] == 0
    code, _, err = run_cli("detokenize", tmp_path / "doubled.txt", "-o", tmp_path / "again.mid")
    assert code == 0 and "warning" not in err, err
    # by default the doubling is what a MIDI player plays: one note, the longer
    notes = [n for i in miditoolkit.MidiFile(str(tmp_path / "again.mid")).instruments for n in i.notes]
    assert sorted((n.pitch, n.start, n.end) for n in notes) == [(60, 0, 960), (64, 480, 960)]
    code, _, err = run_cli("detokenize", tmp_path / "doubled.txt", "-o", tmp_path / "kept.mid", "--keep-overlaps")
    assert code == 0 and "warning" not in err, err
    assert sum(len(i.notes) for i in miditoolkit.MidiFile(str(tmp_path / "kept.mid")).instruments) == 3


def test_two_inputs_for_one_output_are_refused(run_cli, examples, tmp_path):
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "x.mid").write_bytes(examples["piano"].read_bytes())
    code, _, err = run_cli("tokenize", tmp_path / "a" / "x.mid", tmp_path / "b" / "x.mid", "-o", tmp_path / "out")
    assert code == 1 and "would both be written to" in err and not (tmp_path / "out").exists()


def test_metrics_json_is_valid_for_drums(run_cli, examples, tmp_path):
    out = tmp_path / "m.json"
    code, stdout, err = run_cli("eval", "--metrics", examples["groove"], "--reference", examples["groove"],
                                "--json", out)
    assert code == 0, err

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    data = json.loads(out.read_text(), parse_constant=refuse)
    assert data["generated"]["H1"] is None and data["generated"]["GS"] == pytest.approx(1.0)
    assert "drums" in stdout


def test_help_shows_no_value_placeholder_for_flags(run_cli):
    for command in ("generate", "continue", "train", "show", "tokenize"):
        code, out, _ = run_cli(command, "--help")
        assert code == 0 and "--help" in out
        assert "<bool>" not in out, command


@pytest.mark.parametrize("when", ["torch-import", 0.3, 0.8, 1.2, 1.6])
def test_ctrl_c_while_starting_is_one_line_and_130(when):
    """Ctrl-C while torch loads, or soon after. (Before the interpreter runs any of spemusic's code,
    Python's own KeyboardInterrupt is all there is: the test waits until torch is loading.)"""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "spemusic", "generate", "--length", "2000", "-o", "/dev/null/x.mid"],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    maps = Path(f"/proc/{proc.pid}/maps")
    if when == "torch-import":
        if not maps.exists():
            proc.kill()
            pytest.skip("needs /proc to see when torch is loading")
        deadline = time.monotonic() + 60
        while "libtorch" not in maps.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
    else:
        time.sleep(when)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 1:  # it got as far as refusing the output: no interruption left to test
        assert "error:" in err
        return
    assert proc.returncode == 130 and "Traceback" not in err and err.strip().splitlines()[-1] == "interrupted", err


def test_a_file_name_that_is_not_utf8_is_read(run_cli, examples, tmp_path):
    import os

    folder = tmp_path / "odd"
    folder.mkdir()
    name = os.fsdecode(b"caf\xe9.mid")  # Latin-1 bytes: no UTF-8 name
    (folder / name).write_bytes(examples["piano"].read_bytes())
    (folder / "plain.mid").write_bytes(examples["piano"].read_bytes())
    code, out, err = run_cli("data", "prepare", folder, "-o", tmp_path / "cache")
    assert code == 0 and "Traceback" not in err, err
    code, out, err = run_cli("eval", "pop-piano", folder, "--split", "all")
    assert code == 0 and "nats per note" in out, err


def test_a_failed_rewrite_of_a_cache_leaves_the_old_one_whole(examples, tmp_path, monkeypatch):
    import errno
    import shutil

    from spemusic.training import data as data_module

    src = tmp_path / "midi"
    src.mkdir()
    shutil.copy(examples["piano"], src / "a.mid")
    cache = tmp_path / "cache"
    before, _ = prepare(src, cache, workers=1, split_csv=None)
    n = len(before.tokens)
    shutil.copy(examples["groove"], src / "b.mid")  # the source changes: the next run rewrites the cache
    real = data_module.write_atomically

    def disk_full(data, path):
        if str(path).endswith(".npy"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(data, path)

    monkeypatch.setattr(data_module, "write_atomically", disk_full)
    with pytest.raises(OSError):
        prepare(src, cache, workers=1, split_csv=None)
    monkeypatch.setattr(data_module, "write_atomically", real)
    assert len(TokenCache.load(cache).tokens) == n  # the old cache, whole
    (src / "b.mid").unlink()
    again, reused = prepare(src, cache, workers=1, split_csv=None)
    assert reused and len(again.tokens) == n


def test_a_folder_named_like_a_shipped_model_does_not_hide_it(run_cli, tmp_path, monkeypatch):
    """An output folder named groove/ in the working directory: `--model groove` is still the
    shipped model; `./groove` is the folder (refused here: no checkpoint in it)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "groove").mkdir()
    code, out, err = run_cli("generate", "--model", "groove", "--bars", 1, "--seed", 1, "-o", tmp_path / "beat.mid")
    assert code == 0, err
    assert (tmp_path / "beat.mid").is_file()
    code, _, err = run_cli("generate", "--model", "./groove", "--bars", 1, "-o", tmp_path / "x.mid")
    assert code == 1 and "not a spemusic checkpoint" in err and not (tmp_path / "x.mid").exists()


def test_help_lists_the_music_commands_first(run_cli):
    code, out, _ = run_cli("--help")
    assert code == 0
    listed = [line.split()[1] for line in out.splitlines() if line.startswith("│ ") and len(line.split()) > 1]
    names = [n for n in listed if n in ("generate", "continue", "accompany", "render", "show", "play", "train", "eval",
                                        "tokenize", "detokenize", "data", "models")]
    assert names[:6] == ["generate", "continue", "accompany", "render", "show", "play"]
    assert names[6:] == ["train", "eval", "tokenize", "detokenize", "data", "models"]


def test_counts_read_right_for_one_and_for_many():
    from spemusic.words import count, verb

    assert [count(0, "bar"), count(1, "bar"), count(2, "bar"), count(1200, "token")] == \
        ["0 bars", "1 bar", "2 bars", "1,200 tokens"]
    assert verb(1, "holds", "hold") == "holds" and verb(2, "holds", "hold") == "hold"
