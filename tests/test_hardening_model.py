"""Checkpoints and run folders from elsewhere or left broken: one-line errors naming the file and
the field, never a traceback, never gigabytes allocated on a checkpoint's word; a full disk while
saving keeps `last` and leaves no temporary folder; prompts that would explode are bounded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch


def _one_line_error(code: int, err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 1 and lines and lines[-1].startswith("error:") and "Traceback" not in err, err
    return lines[-1]


def _rewrite(src: Path, dst: Path, model_config=None, tokenizer_config=None, tensors=None, raw=None) -> Path:
    """A copy of the checkpoint `src` (its model.safetensors) with metadata fields changed."""
    with safetensors.safe_open(str(src / "model.safetensors"), framework="pt") as f:
        meta, weights = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    for key, changes in (("model_config", model_config), ("tokenizer_config", tokenizer_config)):
        if changes:
            meta[key] = json.dumps({**json.loads(meta[key]), **changes})
    meta.update(raw or {})
    dst.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(tensors if tensors is not None else weights, str(dst / "model.safetensors"), metadata=meta)
    return dst


ABSURD = [
    ({"n_layers": 10**6}, "n_layers must be an integer in 1 … 1,024"),
    ({"n_features": 10**9}, "n_features must be an integer in 1 … 16,384"),
    ({"d_model": 10**6}, "d_model must be an integer in 1 … 65,536"),
    ({"d_ff": 10**9}, "d_ff must be an integer in 1 … 262,144"),
    ({"max_len": 10**9}, "max_len must be an integer in 1 … 16,777,216"),
    ({"kernel_size": 10**9}, "kernel_size must be an integer in 1 … 65,536"),
    # each within its bound, together ~17 trillion parameters: refused by the size estimate
    ({"n_layers": 1024, "d_model": 65536, "d_ff": 262144}, "GB are free"),
    ({"n_layers": "4"}, "n_layers must be an integer in 1 … 1,024, not '4'"),
    ({"bogus": 1}, "unknown model config key(s): bogus"),
]


@pytest.mark.parametrize("changes,message", ABSURD)
def test_model_metadata_is_validated_before_anything_is_allocated(run_cli, tiny_checkpoint, tmp_path, changes, message):
    ck = _rewrite(tiny_checkpoint, tmp_path / "ck", model_config=changes)
    code, _, err = run_cli("generate", "--model", ck, "--length", 16, "-o", tmp_path / "x.mid")
    line = _one_line_error(code, err)
    assert str(ck / "model.safetensors") in line and message in line, line
    assert not (tmp_path / "x.mid").exists()


@pytest.mark.parametrize("changes,message", [
    ({"beat_resolution": 0}, "beat_resolution must be an integer in 1 … 960, not 0"),
    ({"beat_resolution": "12"}, "beat_resolution must be an integer in 1 … 960, not '12'"),
    ({"max_bar_beats": 10**6}, "max_bar_beats must be an integer in 1 … 64"),
    ({"max_duration_beats": 10**9}, "max_duration_beats must be an integer in 1 … 64"),
    ({"tempo_min": float("nan")}, "tempo_min must be a number of BPM"),
    ({"time_signatures": [[4, "x"]]}, "time_signatures must be a list"),
    ({"nope": True}, "unknown tokenizer config key(s): nope"),
])
def test_tokenizer_metadata_is_validated(run_cli, tiny_checkpoint, tmp_path, changes, message):
    ck = _rewrite(tiny_checkpoint, tmp_path / "ck", tokenizer_config=changes)
    code, _, err = run_cli("generate", "--model", ck, "--length", 16, "-o", tmp_path / "x.mid")
    line = _one_line_error(code, err)
    assert str(ck / "model.safetensors") in line and message in line, line


def test_broken_metadata_and_weights(run_cli, tiny_checkpoint, tmp_path):
    cases = {"notjson": dict(raw={"model_config": "{nope"}), "list": dict(raw={"info": "[1, 2]"})}
    with safetensors.safe_open(str(tiny_checkpoint / "model.safetensors"), framework="pt") as f:
        weights = {k: f.get_tensor(k) for k in f.keys()}
    name = next(k for k, v in weights.items() if v.dim() == 2)
    cases["shape"] = dict(tensors={**weights, name: weights[name][:, :3].contiguous()})
    cases["nan"] = dict(tensors={**weights, name: torch.full_like(weights[name], float("nan"))})
    expected = {"notjson": "broken spemusic checkpoint metadata", "list": "info is not a mapping",
                "shape": f"weights do not fit the model config (size mismatch for {name}",
                "nan": f"not finite (NaN or infinity in {name})"}
    for case, kw in cases.items():
        ck = _rewrite(tiny_checkpoint, tmp_path / case, **kw)
        code, _, err = run_cli("generate", "--model", ck, "--length", 16, "-o", tmp_path / "x.mid")
        assert expected[case] in _one_line_error(code, err), (case, err)


def test_models_lists_a_broken_checkpoint_as_unusable(run_cli, tiny_checkpoint, tmp_path, monkeypatch):
    root = tmp_path / "models"
    shutil.copytree(tiny_checkpoint, root / "good")
    _rewrite(tiny_checkpoint, root / "huge", model_config={"n_features": 10**9})
    meta_without_pe = {k: v for k, v in json.loads(safetensors.safe_open(
        str(tiny_checkpoint / "model.safetensors"), framework="pt").metadata()["model_config"]).items() if k != "pe"}
    _rewrite(tiny_checkpoint, root / "nope", raw={"model_config": json.dumps({**meta_without_pe, "pe": 7})})
    monkeypatch.setenv("SPEMUSIC_CHECKPOINTS", str(root))
    code, out, err = run_cli("models")
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "unusable: model config: n_features must be an integer" in rows["huge"], out
    assert "unusable: pe must be one of" in rows["nope"], out
    assert "unusable" not in rows["good"] and "parameters" in rows["good"], out


# --------------------------------------------------------------------------- run folders


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, examples) -> Path:
    """A finished 3-step run of the tiny preset on the example groove (no valid split: no `best`)."""
    from spemusic.training.train import TrainConfig, train

    run = tmp_path_factory.mktemp("runs") / "run"
    train(TrainConfig(data=str(examples["groove"].parent), preset="tiny", seq_len=64, batch_size=2, steps=3,
                      warmup=1, save_every=1, precision="fp32"), run)
    return run


def test_a_run_records_the_vocabulary_it_trained_on(tiny_run):
    from spemusic.nn.checkpoint import load_model

    model, tok = load_model(tiny_run / "last")
    names = {n.split("_")[0] for n, seen in zip(tok.ids_to_tokens(range(len(tok))), model.trained_tokens) if seen}
    assert model.trained_tokens.sum() < len(tok) and {"Bar", "Position", "Pitch", "Program"} <= names


def _broken_copy(tiny_run: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, symlinks=True)
    (run / ".lock").unlink(missing_ok=True)
    return run


def _trainer(run: Path) -> Path:
    return (run / "last").resolve() / "trainer.pt"


@pytest.mark.parametrize("breakage,message", [
    (lambda r: (r / "run.json").write_text("garbage{"), "run.json: not a run record (Expecting value"),
    (lambda r: (r / "run.json").write_text("{}"), "run.json: broken run record (no 'train' mapping)"),
    (lambda r: (r / "run.json").write_text("[1]"), "run.json: not a run record (not a JSON object)"),
    (lambda r: _trainer(r).write_bytes(b""), "trainer.pt: refused: not a spemusic trainer state (empty file)"),
    (lambda r: torch.save({"format": "spemusic"}, _trainer(r)), "trainer.pt: broken trainer state (no optimizer, scheduler"),
])
def test_broken_run_state_is_one_line(run_cli, tiny_run, tmp_path, breakage, message):
    run = _broken_copy(tiny_run, tmp_path)
    breakage(run)
    code, _, err = run_cli("train", "--resume", run, "--steps", 4)
    assert message in _one_line_error(code, err), err


def test_resume_with_weights_of_the_wrong_shape_is_one_line(run_cli, tiny_run, tmp_path):
    run = _broken_copy(tiny_run, tmp_path)
    weights = (run / "last").resolve() / "model.safetensors"
    with safetensors.safe_open(str(weights), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    name = next(k for k, v in tensors.items() if v.dim() == 2)
    tensors[name] = tensors[name][:, :3].contiguous()
    safetensors.torch.save_file(tensors, str(weights), metadata=meta)
    code, _, err = run_cli("train", "--resume", run, "--steps", 4)
    assert f"weights do not fit the run's model (size mismatch for {name}" in _one_line_error(code, err), err


def test_an_unreadable_metrics_line_is_dropped_with_a_note(run_cli, tiny_run, tmp_path):
    run = _broken_copy(tiny_run, tmp_path)
    with open(run / "metrics.jsonl", "a") as f:
        f.write("not json\n[1]\n")
    code, _, err = run_cli("train", "--resume", run, "--steps", 4)
    assert code == 0 and "dropped 2 unreadable line(s)" in err and "done: step 4/4" in err, err
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 4


# --------------------------------------------------------------------------- full disk


@pytest.fixture
def small_disk(tmp_path):
    """A 2,000 KB tmpfs (room for one tiny-preset checkpoint of ~1.2 MB, not two); root only."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a small tmpfs needs root (mount -t tmpfs)")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2000k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield mnt
    subprocess.run(["umount", str(mnt)], capture_output=True)


def test_a_full_disk_while_saving_keeps_last_and_leaves_no_temporary_folder(run_cli, examples, small_disk):
    run = small_disk / "run"
    args = ["--preset", "tiny", "--seq-len", 64, "--batch-size", 2, "--warmup", 1, "--save-every", 1, "--precision", "fp32"]
    code, _, err = run_cli("train", examples["groove"].parent, "-o", run, "--steps", 6, *args)
    line = _one_line_error(code, err)
    assert "no space left on device while saving step 2" in line and "`last` still points at step-00000001" in line, line
    assert [p.name for p in (run / "ckpt").iterdir()] == ["step-00000001"]  # no .tmp-step-* left
    from spemusic.nn.checkpoint import load_model
    load_model(run / "last")
    code, _, err = run_cli("train", "--resume", run, "--steps", 8)  # resuming on the full disk: the same, in one line
    assert "no space left on device while saving step 2" in _one_line_error(code, err)
    assert [p.name for p in (run / "ckpt").iterdir()] == ["step-00000001"]


def test_a_fresh_run_on_a_full_disk_names_the_file(run_cli, examples, small_disk):
    with open(small_disk / "fill", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    code, _, err = run_cli("train", examples["groove"].parent, "-o", small_disk / "run", "--preset", "tiny",
                           "--steps", 2)
    line = _one_line_error(code, err)
    assert str(small_disk / "run") in line and "No space left on device" in line, line
    assert not (small_disk / "run" / "run.json").exists()


# --------------------------------------------------------------------------- prompts


def test_a_prompt_past_the_limit_is_refused_and_fewer_bars_pass(run_cli, tiny_checkpoint, examples, tmp_path, monkeypatch):
    from spemusic.generation import prompts

    monkeypatch.setattr(prompts, "MAX_PROMPT_TOKENS", 100)  # the piano phrase: 232 tokens, its first bar 64
    out = tmp_path / "c.mid"
    code, _, err = run_cli("continue", examples["piano"], "--model", tiny_checkpoint, "--length", 16, "-o", out)
    line = _one_line_error(code, err)
    assert "a prompt may hold at most 100: take fewer bars with --prompt-bars" in line and not out.exists(), line
    code, _, err = run_cli("continue", examples["piano"], "--model", tiny_checkpoint, "--length", 16, "-o", out,
                           "--prompt-bars", 1)
    assert code == 0 and out.exists(), err


def test_a_note_two_to_the_28_ticks_long_costs_no_tick_array():
    """The report's seconds come from the tempo map, not from an array of every tick (2 GB here)."""
    import tracemalloc

    import miditoolkit

    from spemusic.generation.prompts import midi_stats

    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    midi.tempo_changes = [miditoolkit.TempoChange(120.0, 0), miditoolkit.TempoChange(60.0, 960)]
    inst = miditoolkit.Instrument(0)
    inst.notes = [miditoolkit.Note(80, 60, 0, 2**28)]
    midi.instruments = [inst]
    tracemalloc.start()
    notes, seconds = midi_stats(midi)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert notes == 1 and peak < 10**6
    assert seconds == pytest.approx(1.0 + (2**28 - 960) / 480)  # two beats at 120 BPM, then 60 BPM


def test_tick_seconds_agrees_with_miditoolkit_on_real_files(shared_data):
    import miditoolkit

    from spemusic.generation.prompts import tick_seconds

    for path in sorted((shared_data / "pop909").glob("*.mid"))[:3] + sorted((shared_data / "groove").rglob("*.mid"))[:3]:
        midi = miditoolkit.MidiFile(str(path))
        end = max(n.end for i in midi.instruments for n in i.notes)
        assert tick_seconds(midi, end) == pytest.approx(float(midi.get_tick_to_time_mapping()[end]), rel=1e-9), path
