"""spemusic train: learning on real data, exact resume, kill safety, torchrun, safe loading."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

from spemusic.nn.checkpoint import load_model
from spemusic.tokens.tokenizer import TokenizerConfig

POP_FILES = ["001.mid", "002.mid", "003.mid", "004.mid", "005.mid", "006.mid", "007.mid", "008.mid"]
VALID_FILES = ["009.mid", "010.mid"]


@pytest.fixture(scope="module")
def pop_subset(shared_data, tmp_path_factory) -> Path:
    """A handful of real POP909 songs (symbolic links, nothing copied) with a split CSV."""
    folder = tmp_path_factory.mktemp("pop-subset")
    with open(folder / "info.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["midi_filename", "split"])
        for name in POP_FILES + VALID_FILES:
            (folder / name).symlink_to((shared_data / "pop909" / name).resolve())
            w.writerow([name, "valid" if name in VALID_FILES else "train"])
    return folder


@pytest.fixture(scope="module")
def pop_cache(pop_subset, tmp_path_factory) -> Path:
    from spemusic.training.data import prepare

    cache = tmp_path_factory.mktemp("cache") / "pop"
    prepare(pop_subset, cache, workers=1)
    return cache


def _train(run_cli, data, run_dir, *extra):
    code, out, err = run_cli("train", data, "-o", run_dir, "--preset", "tiny", "--seq-len", 128, "--batch-size", 8,
                             "--lr", 3e-3, "--warmup", 20, "--precision", "fp32", "--seed", 1, *extra)
    assert code == 0, err
    return _metrics(run_dir)


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


TINY = dict(preset="tiny", seq_len=128, batch_size=8, lr=3e-3, warmup=20, precision="fp32", seed=1)


def _train_lib(data, run_dir, stop_after=None, events=None, **options) -> list[dict]:
    """A run through the library (TINY's options, as `_train` gives the CLI); its metrics.jsonl records."""
    from spemusic.training.train import TrainConfig, train

    train(TrainConfig(data=str(data), **{**TINY, **options}), run_dir, stop_after=stop_after, events=events)
    return _metrics(run_dir)


def test_tiny_model_learns_real_music(pop_cache, tmp_path):
    from spemusic.training.train import TrainEvents

    class Recorder(TrainEvents):
        def __init__(self):
            self.steps, self.records = [], []

        def step(self, step, loss):
            self.steps.append(step)

        def log(self, record, tokens_per_s):
            self.records.append(record)

    events = Recorder()
    metrics = _train_lib(pop_cache, tmp_path / "run", steps=300, val_every=100, log_every=10, events=events)
    assert events.steps == list(range(1, 301)) and events.records == metrics  # the callback sees what is logged
    first, last = metrics[0], metrics[-1]
    valid = [m["valid_loss"] for m in metrics if "valid_loss" in m]
    # measured: 5.89 for the first 10 steps, 2.51 after 300 steps (43%); valid 3.85, 2.58, 2.53
    assert last["train_loss"] < 0.6 * first["train_loss"], metrics
    assert len(valid) == 3 and valid[-1] < valid[0], valid
    assert set(first) >= {"step", "train_loss", "lr", "tokens_per_s", "tokens"}
    model, tok = load_model(tmp_path / "run" / "best")
    assert model.cfg.vocab_size == len(tok)
    load_model(tmp_path / "run" / "last")


def test_resume_is_exact(run_cli, pop_cache, tmp_path, monkeypatch):
    from spemusic.errors import OptionError
    from spemusic.training.train import train

    common = dict(steps=40, val_every=15, save_every=100, feature_redraw=7)
    _train_lib(pop_cache, tmp_path / "once", **common)
    _train_lib(pop_cache, tmp_path / "split", **common, stop_after=20)
    code, _, err = run_cli("train", "--resume", tmp_path / "split", "--seq-len", 64)
    assert code == 1 and "drop --seq-len" in err
    with pytest.raises(OptionError, match="drop seq_len"):  # the library names its parameters
        train({"seq_len": 64}, tmp_path / "split", resume=True)
    train({}, tmp_path / "split", resume=True)
    code, _, err = run_cli("train", "--resume", tmp_path / "split")
    assert code == 1 and "already trained for its 40 steps" in err and "Traceback" not in err
    a = safetensors.torch.load_file(str(tmp_path / "once" / "last" / "model.safetensors"))
    b = safetensors.torch.load_file(str(tmp_path / "split" / "last" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after resume"
    once = (tmp_path / "once" / "metrics.jsonl").read_text()
    split = (tmp_path / "split" / "metrics.jsonl").read_text()
    strip = lambda text: [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"}  # noqa: E731
                          for line in text.splitlines()]
    assert strip(once) == strip(split)
    # run folders in $SPEMUSIC_CHECKPOINTS are models by name (their best, else last)
    monkeypatch.setenv("SPEMUSIC_CHECKPOINTS", str(tmp_path))
    code, out, _ = run_cli("models")
    assert code == 0 and {"once", "split"} <= {line.split()[0] for line in out.splitlines()}
    assert load_model("split")[0].cfg.n_layers == 2


def test_positional_parameters_are_not_decayed_and_a_legacy_run_resumes_with_its_rule(pop_cache, tmp_path,
                                                                                        monkeypatch):
    import spemusic.training.train as train_module
    from spemusic.nn.model import ModelConfig, Performer
    from spemusic.training.train import decay_groups, train

    model = Performer(ModelConfig(vocab_size=32, n_layers=2, d_model=32, n_heads=2, d_ff=64, pe="sinespe", gated=True,
                                  n_realizations=8, n_features=8))
    decay, no_decay = (set(map(id, group)) for group in decay_groups(model))
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[i] for i in no_decay if names[i].startswith("spe.") or names[i].endswith(".gate")} == {
        n for n in names.values() if n.startswith("spe.") or n.endswith(".gate")}
    assert any(names[i].endswith("qkv.weight") for i in decay)
    legacy_decay, _ = decay_groups(model, legacy=True)
    assert len(legacy_decay) > len(decay)  # the legacy rule decayed the positional parameters too
    # a run saved under the legacy rule resumes under it: the same weights as the run left alone
    monkeypatch.setattr(train_module, "decay_groups", lambda model, legacy=False: decay_groups(model, legacy=True))
    common = dict(steps=30, val_every=15, save_every=100)
    _train_lib(pop_cache, tmp_path / "once", **common)
    _train_lib(pop_cache, tmp_path / "split", **common, stop_after=15)
    monkeypatch.undo()
    train({}, tmp_path / "split", resume=True)
    a = safetensors.torch.load_file(str(tmp_path / "once" / "last" / "model.safetensors"))
    b = safetensors.torch.load_file(str(tmp_path / "split" / "last" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sigkill_leaves_a_loadable_checkpoint(pop_cache, tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "spemusic", "train", str(pop_cache), "-o", str(run), "--preset", "tiny",
           "--seq-len", "128", "--batch-size", "4", "--steps", "100000", "--save-every", "1", "--val-every", "100000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not (run / "last").exists() and time.time() < deadline:
        time.sleep(0.2)
    # kill at several moments while it trains and saves every step
    for delay in (0.7, 0.31, 0.53):
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        model, _ = load_model(run / "last")
        assert model is not None
        proc = subprocess.Popen([sys.executable, "-m", "spemusic", "train", "--resume", str(run)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    model, _ = load_model(run / "last")
    assert model is not None


def test_torchrun_two_processes_match_one(pop_cache, tmp_path, run_cli):
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    # an absolute PE: the training code draws no SPE noise, so both runs see identical numbers
    args = ["--preset", "tiny", "--pe", "ape", "--seq-len", "128", "--batch-size", "4", "--steps", "12",
            "--log-every", "4", "--val-every", "100", "--lr", "3e-3", "--warmup", "4", "--seed", "3",
            "--precision", "fp32"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ddp = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", "-m", "spemusic", "train",
                          str(pop_cache), "-o", str(tmp_path / "ddp"), *args],
                         capture_output=True, text=True, env=env, timeout=600)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    code, _, err = run_cli("train", pop_cache, "-o", tmp_path / "single", *args)
    assert code == 0, err
    load = lambda d: [json.loads(line) for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    ddp_m, one_m = load("ddp"), load("single")
    assert [m["step"] for m in ddp_m] == [m["step"] for m in one_m] == [4, 8, 12]
    for a, b in zip(ddp_m, one_m):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=2e-3)
    # rank 0 alone writes: one metrics line per log step, one run.json, one checkpoint
    assert sorted(p.name for p in (tmp_path / "ddp").iterdir()) == [".lock", "best", "ckpt", "last", "metrics.jsonl",
                                                                   "run.json"]
    assert "2 process(es)" in ddp.stderr


def test_foreign_and_malicious_checkpoints_are_refused(run_cli, tiny_checkpoint, tmp_path, pop_cache):
    # a safetensors file that is not a spemusic checkpoint
    plain = tmp_path / "plain"
    plain.mkdir()
    safetensors.torch.save_file({"w": torch.zeros(2)}, str(plain / "model.safetensors"))
    with pytest.raises(Exception, match="not a spemusic checkpoint"):
        load_model(plain)
    code, _, err = run_cli("generate", "--model", plain, "--length", 10, "-o", tmp_path / "x.mid")
    assert code == 1 and "not a spemusic checkpoint" in err and len(err.strip().splitlines()) == 1
    # a pickle that would run code when loaded, planted as the trainer state of a run
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    run = tmp_path / "run"
    _train(run_cli, pop_cache, run, "--steps", 2, "--val-every", 100)
    torch.save({"format": "spemusic", "x": Evil()}, (run / "last").resolve() / "trainer.pt")
    code, _, err = run_cli("train", "--resume", run)
    assert code == 1 and "refused" in err and len(err.strip().splitlines()) == 1
    assert not marker.exists()
    # a checkpoint whose weights do not fit its config
    bad = tmp_path / "bad"
    bad.mkdir()
    meta = safetensors.safe_open(str(tiny_checkpoint / "model.safetensors"), "pt").metadata()
    safetensors.torch.save_file({"w": torch.zeros(2)}, str(bad / "model.safetensors"), metadata=meta)
    code, _, err = run_cli("generate", "--model", bad, "--length", 10, "-o", tmp_path / "y.mid")
    assert code == 1 and "do not fit" in err


@pytest.mark.parametrize("toml,message", [
    ('steps = "five"', "steps in"), ("steps = 5.5", "must be an integer"), ('gated = "no"', "true or false"),
    ('lr = "1e-3"', "must be a number"), ("[train]\nsteps = 5", "top-level keys"), ("bogus = 1", "bogus"),
])
def test_config_file_values_are_checked(run_cli, pop_cache, tmp_path, toml, message):
    config = tmp_path / "c.toml"
    config.write_text(toml + "\n")
    code, _, err = run_cli("train", pop_cache, "-o", tmp_path / "r", "--config", config)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and message in lines[0] and "Traceback" not in err, err
    assert "c.toml" in lines[0] and not (tmp_path / "r").exists()


def test_resume_from_another_folder_and_stop_after_says_how(run_cli, pop_subset, tmp_path, monkeypatch):
    import shutil

    work = tmp_path / "work"
    shutil.copytree(pop_subset, work / "midi", symlinks=True)
    monkeypatch.chdir(work)  # DATA and RUN given relative to this folder
    code, _, err = run_cli("train", "midi", "-o", "run", "--preset", "tiny", "--seq-len", 64, "--batch-size", 2,
                           "--steps", 4, "--stop-after", 2, "--val-every", 100)
    assert code == 0 and "stopped (--stop-after): step 2/4" in err and "train --resume run" in err, err
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("train", "--resume", work / "run", "--steps", 3)  # was silently taken as 4
    assert code == 1 and "--steps 3 is below the run's 4 steps" in " ".join(err.split()), err
    code, _, err = run_cli("train", "--resume", work / "run")
    assert code == 0 and "done: step 4/4" in err, err
    # a run planned in epochs resumes too (its record holds the steps they came to)
    code, _, err = run_cli("train", work / "midi", "-o", work / "ep", "--preset", "tiny", "--seq-len", 64,
                           "--batch-size", 2, "--epochs", 0.02, "--stop-after", 1, "--val-every", 100)
    assert code == 0, err
    code, _, err = run_cli("train", "--resume", work / "ep")
    assert code == 0 and "done: step" in err, err


def test_train_bad_options(run_cli, pop_cache, tmp_path):
    code, _, err = run_cli("train", tmp_path / "missing", "-o", tmp_path / "r", "--steps", 1)
    assert code == 1 and "no such file or folder" in err
    code, _, err = run_cli("train", pop_cache, "-o", tmp_path / "r")
    assert code == 1 and "--steps or --epochs" in err
    code, _, err = run_cli("train", pop_cache, "-o", tmp_path / "r", "--steps", 1, "--seq-len", 0)
    assert code == 1 and "--seq-len" in err
    code, _, err = run_cli("train", "--resume", tmp_path / "nothing")
    assert code == 1 and "nothing to resume" in err
    code, _, err = run_cli("train", pop_cache, "-o", tmp_path / "r", "--steps", 2, "--epochs", 1)
    assert code == 1 and "not both" in err
    for option, value in (("--lr", "inf"), ("--lr", "nan"), ("--weight-decay", "nan")):
        code, _, err = run_cli("train", pop_cache, "-o", tmp_path / "r", "--steps", 2, option, value)
        assert code == 1 and f"{option} must be a finite number" in err, err
    code, _, err = run_cli("train", pop_cache, "-o", tmp_path / "r", "--steps", 2, "--piece-starts", 1.5)
    assert code == 1 and "--piece-starts must be in 0 … 1 (got 1.5)" in err, err
    code, _, err = run_cli("train", pop_cache, "-o", tmp_path / "r", "--steps", 2, "--scheduled-sampling", 1)
    assert code == 1 and "--scheduled-sampling must be in [0, 1) (got 1.0)" in err, err
    code, _, err = run_cli("train", pop_cache, "-o", tmp_path / "r", "--steps", 2, "--pe", "ape", "--max-len", 64,
                           "--seq-len", 128)
    assert code == 1 and "--max-len 64" in err
    a_file = tmp_path / "file.mid"
    a_file.write_bytes(b"")
    code, _, err = run_cli("train", pop_cache, "-o", a_file, "--steps", 2)
    assert code == 1 and "not a folder" in err
    assert not (tmp_path / "r").exists()  # refused before the run folder is made


def test_fine_tune_starts_from_the_given_model(run_cli, pop_cache, tmp_path):
    from spemusic.training.train import TrainConfig, train

    base = _train_lib(pop_cache, tmp_path / "base", steps=60, val_every=60, log_every=10)
    train(TrainConfig(data=str(pop_cache), init_from=str(tmp_path / "base" / "best"), seq_len=256, batch_size=4,
                      steps=10, lr=1e-4, warmup=2, log_every=1, val_every=5, precision="fp32"),
          tmp_path / "ft", stop_after=5)
    ft = _metrics(tmp_path / "ft")
    # a fresh tiny model starts near ln(vocab) ≈ 5.9; the fine-tune starts where the base run ended
    assert ft[0]["train_loss"] < base[0]["train_loss"] - 1.0, (base[0], ft[0])
    assert abs(ft[0]["train_loss"] - base[-1]["train_loss"]) < 0.5, (base[-1], ft[0])
    run = json.loads((tmp_path / "ft" / "run.json").read_text())
    assert run["model"] == json.loads((tmp_path / "base" / "run.json").read_text())["model"]
    assert run["train"]["seq_len"] == 256 and run["train"]["preset"] == "tiny"
    train({}, tmp_path / "ft", resume=True)  # resumes from its own record
    model, _ = load_model(tmp_path / "ft" / "last")
    assert model.cfg.n_layers == 2
    code, _, err = run_cli("train", pop_cache, "-o", tmp_path / "x", "--init-from", tmp_path / "base" / "best",
                           "--pe", "ape", "--steps", 1)
    assert code == 1 and "drop --pe" in err
    code, _, err = run_cli("train", pop_cache, "-o", tmp_path / "x", "--init-from", tmp_path / "nowhere", "--steps", 1)
    assert code == 1 and "nowhere" in err and not (tmp_path / "x").exists()


def test_fine_tune_adds_a_short_convolution(run_cli, pop_cache, tmp_path):
    """A model trained without the short convolution gets one at zero: same function at the start
    (the fine-tune's first loss is the base's), then it learns; a different size is refused."""
    from spemusic.training.train import TrainConfig, train

    _train_lib(pop_cache, tmp_path / "base", steps=40, val_every=40, short_conv=0)
    base_model, _ = load_model(tmp_path / "base" / "best")
    assert base_model.cfg.short_conv == 0
    options = dict(seq_len=128, batch_size=8, steps=20, lr=1e-3, warmup=2, log_every=1, val_every=20,
                   precision="fp32", seed=3)
    losses = {}
    for k in (0, 4):
        train(TrainConfig(data=str(pop_cache), init_from=str(tmp_path / "base" / "best"), short_conv=k, **options),
              tmp_path / f"ft{k}")
        losses[k] = [m["train_loss"] for m in _metrics(tmp_path / f"ft{k}")]
    assert losses[4][0] == pytest.approx(losses[0][0], abs=1e-3)  # same batches, same function at step 1
    model, _ = load_model(tmp_path / "ft4" / "last")
    assert model.cfg.short_conv == 4 and all(b.shift.abs().sum() > 0 for b in model.blocks)
    code, _, err = run_cli("train", pop_cache, "-o", tmp_path / "x", "--init-from", tmp_path / "ft4" / "last",
                           "--short-conv", 2, "--steps", 1)
    assert code == 1 and "cannot shorten it" in err


def test_auto_precision_measures_and_keeps_the_random_stream():
    from spemusic.nn.device import measure_precisions, pick_dtype
    from spemusic.nn.model import ModelConfig

    cfg = ModelConfig.preset("tiny", vocab_size=60)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    speed = measure_precisions(cfg, 2, 64, torch.device("cpu"))
    assert set(speed) == {"fp32", "bf16"} and all(v > 0 for v in speed.values())
    assert torch.equal(torch.rand(3), expected)  # the run draws what it would have drawn
    dtype, why = pick_dtype("auto", torch.device("cpu"), cfg, 2, 64)
    assert dtype in (torch.float32, torch.bfloat16) and why.startswith("auto")
    assert pick_dtype("fp32", torch.device("cpu")) == (torch.float32, "asked")


def test_library_errors_name_parameters_and_the_cli_spells_them_as_flags():
    from spemusic.cli import _flag
    from spemusic.errors import OptionError
    from spemusic.nn.device import pick_device
    from spemusic.training.train import TrainConfig

    with pytest.raises(OptionError) as e:
        TrainConfig(data="x", steps=1, seq_len=0).check()
    assert str(e.value) == "seq_len must be at least 1" and e.value.spelled(_flag) == "--seq-len must be at least 1"
    with pytest.raises(OptionError) as e:
        pick_device("tpu", auto=False)
    assert e.value.spelled(_flag) == "--device must be cpu or cuda (got 'tpu')"


def test_non_finite_weights_are_refused(tiny_checkpoint, tmp_path):
    import shutil

    from spemusic.errors import SpemusicError

    bad = tmp_path / "nan-model"
    shutil.copytree(tiny_checkpoint, bad)
    weights = next(bad.glob("*.safetensors"))
    tensors = safetensors.torch.load_file(str(weights))
    name = next(k for k, v in tensors.items() if v.is_floating_point())
    tensors[name][0] = float("nan")
    with safetensors.safe_open(str(weights), "pt") as f:
        meta = f.metadata()
    safetensors.torch.save_file(tensors, str(weights), metadata=meta)
    with pytest.raises(SpemusicError, match="not finite"):
        load_model(bad)


def test_a_second_writer_of_a_run_folder_is_refused(run_cli, pop_cache, tmp_path):
    import os

    from spemusic.training.train import lock_run_folder

    run = tmp_path / "run"
    code, _, err = run_cli("train", pop_cache, "-o", run, "--preset", "tiny", "--seq-len", 64, "--batch-size", 2,
                           "--steps", 2, "--stop-after", 1, "--val-every", 100)
    assert code == 0, err
    metrics = (run / "metrics.jsonl").read_bytes()
    fresh = tmp_path / "fresh"
    held = [lock_run_folder(run), lock_run_folder(fresh)]  # as other `spemusic train` processes would hold them
    try:
        for args in (["--resume", run], [pop_cache, "-o", fresh, "--preset", "tiny", "--seq-len", 64, "--steps", 2]):
            code, _, err = run_cli("train", *args)
            assert code == 1 and f"another spemusic train (pid {os.getpid()}) is writing this run" in err, err
        assert (run / "metrics.jsonl").read_bytes() == metrics  # nothing touched
        assert not (fresh / "run.json").exists()
    finally:
        for h in held:
            h.close()
    code, _, err = run_cli("train", "--resume", run)  # the lock goes with its holder
    assert code == 0 and "done: step 2/2" in err, err


def test_a_run_folder_whose_links_were_lost_resumes_and_is_never_overwritten(run_cli, pop_cache, tmp_path):
    run = tmp_path / "run"
    code, _, err = run_cli("train", pop_cache, "-o", run, "--preset", "tiny", "--seq-len", 64, "--batch-size", 2,
                           "--steps", 3, "--stop-after", 2, "--val-every", 100)
    assert code == 0, err
    saved = sorted((run / "ckpt").iterdir())
    for name in ("last", "best"):  # as a copy that drops symbolic links leaves it
        (run / name).unlink(missing_ok=True)
    code, _, err = run_cli("train", pop_cache, "-o", run, "--preset", "tiny", "--seq-len", 64, "--steps", 3)
    assert code == 1 and "holds 1 complete checkpoint(s) (ckpt/step-00000002 the newest)" in err, err
    assert sorted((run / "ckpt").iterdir()) == saved  # nothing deleted
    code, _, err = run_cli("train", "--resume", run)
    assert code == 0 and "`last` was missing" in err and "done: step 3/3" in err, err


@pytest.mark.parametrize("args,message", [
    (["--batch-size", 1_000_000_000], "would need ~"),
    (["--seq-len", 1_000_000_000], "would need ~"),
])
def test_a_step_that_cannot_fit_is_refused_before_any_allocation(run_cli, pop_cache, tmp_path, args, message):
    code, _, err = run_cli("train", pop_cache, "-o", tmp_path / "run", "--preset", "tiny", "--steps", 1, *args)
    assert code == 1 and message in err and "GB are free" in err and len(err.strip().splitlines()) == 1, err


def test_a_config_file_that_is_not_text_is_one_line(run_cli, pop_cache, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"\xff\xfe")
    code, _, err = run_cli("train", pop_cache, "-o", tmp_path / "run", "--config", bad)
    assert code == 1 and "not a TOML config file" in err, err


def test_pitch_memory_and_bar_echo_fine_tune(run_cli, pop_subset, pop_cache, tmp_path):
    """--pitch-memory over the parts, --bar-echo and --echo-head: added at zero to a model without
    them (the fine-tune's first loss is the base's), learned, kept in the checkpoint; the pitch
    memory is refused without parts, the echo head without the bar echo."""
    from spemusic.training.data import prepare
    from spemusic.training.train import TrainConfig, train

    cache = tmp_path / "parts"
    prepare(pop_subset, cache, workers=1, config=TokenizerConfig(parts=True))
    _train_lib(cache, tmp_path / "base", steps=30, val_every=30)
    options = dict(seq_len=128, batch_size=8, steps=15, lr=3e-3, warmup=2, log_every=1, val_every=15,
                   precision="fp32", seed=3)
    losses = {}
    for name, extra in (("plain", {}), ("memory", {"pitch_memory": True}), ("echo", {"bar_echo": True}),
                        ("intervals", {"interval_head": True}), ("echo-head", {"bar_echo": True, "echo_head": True}),
                        ("key", {"key_head": True})):
        train(TrainConfig(data=str(cache), init_from=str(tmp_path / "base" / "best"), **extra, **options),
              tmp_path / name)
        losses[name] = [m["train_loss"] for m in _metrics(tmp_path / name)]
    for name in ("memory", "echo", "intervals", "echo-head", "key"):  # same batches, same function at step 1
        assert losses[name][0] == pytest.approx(losses["plain"][0], abs=1e-3)
    model, tok = load_model(tmp_path / "memory" / "last")
    assert model.cfg.pitch_memory == [tok.token_to_id[f"Program_{p}"] for p in ("melody", "bridge", "piano")]
    assert model.pitch_memory.weight.abs().sum() > 0 and model.bar_echo is None
    model, tok = load_model(tmp_path / "echo" / "last")
    assert model.cfg.bar_echo == [tok.bar_id, *tok.range("Position")] and model.bar_echo.weight.abs().sum() > 0
    model, tok = load_model(tmp_path / "intervals" / "last")
    assert model.cfg.interval_head == [tok.token_to_id[f"Program_{p}"] for p in ("melody", "bridge", "piano")]
    assert model.cfg.bar_id == tok.bar_id and model.interval_head.weight.abs().sum() > 0
    model, tok = load_model(tmp_path / "echo-head" / "last")
    assert model.cfg.echo_head == [1, 2, 4, 8] and model.echo_head.weight.abs().sum() > 0
    assert model.cfg.echo_kinds == [list(tok.range(kind)) for kind in ("Position", "Pitch", "Velocity", "Duration")]
    model, tok = load_model(tmp_path / "key" / "last")
    assert model.cfg.key_head == [tok.token_to_id[f"Program_{p}"] for p in ("melody", "bridge", "piano")]
    assert model.key_head.weight.abs().sum() > 0
    code, _, err = run_cli("train", pop_cache, "-o", tmp_path / "x", "--preset", "tiny", "--echo-head", "--steps", 1)
    assert code == 1 and "--echo-head needs the bar echo: add --bar-echo" in err and "Traceback" not in err
    for flag in ("--pitch-memory", "--interval-head", "--key-head"):
        code, _, err = run_cli("train", pop_cache, "-o", tmp_path / "x", "--preset", "tiny", flag, "--steps", 1)
        assert code == 1 and f"{flag} needs parts" in err and "Traceback" not in err
    code, _, err = run_cli("train", pop_cache, "-o", tmp_path / "x", "--preset", "tiny", "--dropout", 1.5, "--steps", 1)
    assert code == 1 and "--dropout must be in [0, 1)" in err and "Traceback" not in err
    # a melody-first layout goes through each bar twice: its echo reads each pass from its own; the
    # melody head reads the bar's melody under the other parts (no chords here: no chord table); the
    # bar clock, added to it, counts the bars of windows that open a piece
    first = tmp_path / "melody-first"
    prepare(pop_subset, first, workers=1, config=TokenizerConfig(parts=True, melody_first=True))
    code, _, err = run_cli("train", first, "-o", tmp_path / "y", "--preset", "tiny", "--bar-echo", "--melody-head",
                           "--steps", 2, "--seq-len", 128, "--batch-size", 2, "--val-every", 2, "--dropout", 0.1)
    assert code == 0, err
    model, tok = load_model(tmp_path / "y" / "last")
    assert model.cfg.bar_echo == [tok.bar_id, *tok.range("Position")] and tok.config.melody_first
    assert model.cfg.dropout == 0.1 and not model.training  # (dropout in training only)
    assert model.cfg.melody_head == [tok.token_to_id[f"Program_{p}"] for p in ("melody", "bridge", "piano")]
    assert model.melody_head.weight.abs().sum() > 0 and model.chord_head is None
    code, _, err = run_cli("train", first, "-o", tmp_path / "z", "--init-from", tmp_path / "y" / "last", "--bar-clock",
                           "--piece-starts", 1.0, "--steps", 1, "--seq-len", 128, "--batch-size", 2, "--val-every", 1)
    assert code == 0, err
    model, tok = load_model(tmp_path / "z" / "last")
    assert model.cfg.bar_clock == [tok.bos_id, tok.bar_id, 16, tok.token_to_id["Program_melody"], 8]
    assert model.bar_clock.weight[:3].abs().sum() > 0 and model.rest_clock.weight.abs().sum() > 0
    refusals = ((cache, ("--bar-echo",), "--melody-head needs each bar's melody first: add --melody-first"),
                (first, (), "--melody-head needs the bar echo: add --bar-echo"))
    for data, flags, message in refusals:
        code, _, err = run_cli("train", data, "-o", tmp_path / "x", "--preset", "tiny", "--melody-head", *flags,
                               "--steps", 1)
        assert code == 1 and message in err and "Traceback" not in err, err


def test_a_fine_tune_adds_repeat_marks_with_their_rows_fitted(pop_subset, tmp_path):
    """--repeats on a melody-first model with the echo head: the five marks join its vocabulary
    (every other token keeps its id and row), their rows are fitted on the model's own states
    before the first step (the marks then cost less than from the mean row they start as), and
    the echo head gets its second table as a copy of the first."""
    from dataclasses import replace

    import torch

    from spemusic.tokens.tokenizer import REMITokenizer
    from spemusic.training.data import TokenCache, WindowSampler, prepare
    from spemusic.training.train import (
        TrainConfig,
        TrainEvents,
        fit_new_rows,
        repeat_marks_config,
        train,
        widened,
        with_vocabulary,
    )

    cache = tmp_path / "melody-first"
    prepare(pop_subset, cache, workers=1, config=TokenizerConfig(parts=True, melody_first=True))
    _train_lib(cache, tmp_path / "base", steps=20, val_every=20, bar_echo=True, echo_head=True, echo_bars=2)
    base, base_tok = load_model(tmp_path / "base" / "best")
    notes = []

    class Notes(TrainEvents):
        def note(self, text):
            notes.append(text)

    options = {**TINY, "steps": 2, "val_every": 2}
    train(TrainConfig(data=str(pop_subset), init_from=str(tmp_path / "base" / "best"), repeats=True, **options),
          tmp_path / "marked", events=Notes())
    model, tok = load_model(tmp_path / "marked" / "last")
    assert tok.config.repeats and tok.vocab[-5:] == [f"Repeat_{lag}" for lag in (0, 1, 2, 4, 8)]
    assert tok.vocab[:-5] == base_tok.vocab and model.cfg.repeat_marks == [[len(base_tok) + i, lag]
                                                                          for i, lag in enumerate((0, 1, 2, 4, 8))]
    assert model.echo_head.weight.shape[1] == 2 * base.echo_head.weight.shape[1]
    assert any("5 new tokens' rows fitted" in n for n in notes), notes
    # the fit itself: from the mean row, the marks' NLL on the windows falls
    tok2 = REMITokenizer(replace(base_tok.config, repeats=True))
    wider = with_vocabulary(base, base_tok, tok2, {})
    wider = widened(wider, replace(wider.cfg, repeat_marks=repeat_marks_config(tok2)))
    assert torch.equal(wider.echo_head.weight[:, :3], base.echo_head.weight[:, :3])
    marked_cache = tmp_path / "marked-cache"
    prepare(pop_subset, marked_cache, workers=1, config=tok2.config)
    sampler = WindowSampler(TokenCache.load(marked_cache), "train", 64)
    rows = list(range(len(base_tok), len(tok2)))
    before = fit_new_rows(wider, sampler, rows, tok2.pad_id, windows=4, steps=0)
    after = fit_new_rows(wider, sampler, rows, tok2.pad_id, windows=4, steps=100)
    assert after < before - 0.5, (before, after)


def test_scheduled_sampling_feeds_the_models_own_notes(tiny_checkpoint, pop_cache, tmp_path):
    """--scheduled-sampling: a share of the windows' pitches, durations and velocities is replaced
    by the model's own draw of the same kind; every other token (bars, positions, the first) stays,
    the same generator gives the same batch, and a run trains with it."""
    from spemusic.training.data import TokenCache, WindowSampler
    from spemusic.training.train import OWN_DRAW_KINDS, own_draw_kinds, with_own_draws

    model, tok = load_model(tiny_checkpoint)
    windows = WindowSampler(TokenCache.load(pop_cache), "train", 256).sample(np.random.default_rng(0), 4)
    batch = torch.from_numpy(windows)
    draw_kinds = own_draw_kinds(tok)
    fed = with_own_draws(model, batch, draw_kinds, 0.5, torch.Generator().manual_seed(3))
    assert torch.equal(fed, with_own_draws(model, batch, draw_kinds, 0.5, torch.Generator().manual_seed(3)))
    kinds = torch.from_numpy(tok.kinds)
    notes = torch.zeros_like(batch, dtype=torch.bool)
    for name in OWN_DRAW_KINDS:
        lo, hi = tok.range(name)
        notes |= (batch >= lo) & (batch < hi)
    changed = fed != batch
    assert not changed[~notes].any() and not changed[:, 0].any()
    assert torch.equal(kinds[fed[changed]], kinds[batch[changed]])
    assert 0.2 < changed[notes].float().mean() < 0.5  # half drawn, some draws the true token
    rows = _train_lib(pop_cache, tmp_path / "run", steps=4, val_every=4, scheduled_sampling=0.3)
    assert rows[-1]["step"] == 4 and all(math.isfinite(r["train_loss"]) for r in rows if "train_loss" in r)
