"""Training: AdamW + warmup/cosine, bf16 autocast where it pays, validation, atomic checkpoints,
exact resume, and DistributedDataParallel when started by torchrun.

`train` runs in steps, each a function here: `resolve_run` (the options, and every rule of
resuming), `build_model` (fresh, fine-tuned or resumed), `build_optimizer_and_scheduler`,
`restore_trainer_state` (the pair of `trainer_state`, which each checkpoint saves), and the loop
(`_Loop`). It reports through a `TrainEvents` object, which the CLI turns into its output.
Errors and warnings name options by parameter (`errors.OptionError`); the CLI spells them as flags."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..errors import OptionError, OptionWarning, SpemusicError
from ..files import check_output_folder, write_atomically
from ..memory import available_memory
from ..nn import checkpoint, compiled
from ..nn.device import pick_device, pick_dtype
from ..nn.model import ModelConfig, Performer
from ..options import PRESETS, TrainConfig, check_layout
from ..tokens.chords import QUALITIES
from ..tokens.tokenizer import PARTS, REMITokenizer, TokenizerConfig
from ..words import count
from .data import TokenCache, WindowSampler, fixed_windows, open_dataset, trained_vocabulary

# ----------------------------------------------------------------------------- schedule

def with_vocabulary(model: Performer, old: REMITokenizer, new: REMITokenizer, like: dict[str, str]) -> Performer:
    """The same model over the vocabulary of `new`: every token keeps its embedding row (found by
    name), a new token starts as the token `like` names for it (else as the mean row), so the
    model computes what it computed until it writes a new token."""
    with torch.random.fork_rng(devices=[]):  # the run draws the same SPE codes as without it
        wider = Performer(replace(model.cfg, vocab_size=len(new))).to(model.device)
    by_token = {"tok.weight", "bar_echo.weight"}  # rows by token id (the bar echo's last: no echo)
    state = {n: v for n, v in model.state_dict().items() if n not in by_token}
    missing, unexpected = wider.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= by_token | {"head.weight"}, (missing, unexpected)
    old_rows = model.tok.weight.detach()
    with torch.no_grad():
        for i, name in enumerate(new.vocab):
            j = old.token_to_id.get(name, old.token_to_id.get(like.get(name, "")))
            wider.tok.weight[i] = old_rows[j] if j is not None else old_rows.mean(0)
            if model.bar_echo is not None:  # a new token's echo starts at zero, as the echo did
                wider.bar_echo.weight[i] = model.bar_echo.weight[j] if j is not None else 0
        if model.bar_echo is not None:
            wider.bar_echo.weight[-1] = model.bar_echo.weight[-1]
    wider.trained_tokens = None
    wider.new_rows = [i for i, name in enumerate(new.vocab) if name not in old.token_to_id and name not in like]
    return wider


@torch.no_grad()
def _states_and_logits(model: Performer, batch: torch.Tensor) -> tuple:
    model.eval()
    out = [model.logits_and_hidden(w[:, :-1]) for w in batch.split(4)]
    return torch.cat([o[1] for o in out]).flatten(0, 1), torch.cat([o[0] for o in out]).float().flatten(0, 1)


def fit_new_rows(model: Performer, sampler: WindowSampler, rows: list[int], pad_id: int, windows: int = 32,
                 steps: int = 200, pull: float = 0.01) -> float:
    """Fit the embedding rows of the tokens a fine-tune adds (`rows`) as rows of the output layer,
    the rest of the model frozen, on its final states over `windows` training windows: the model
    names a new token where the data has it from the fine-tune's first step. Why: a new row starts
    as the mean row and Adam moves each entry by about the learning rate a step; adding the Repeat
    marks to pop-piano at 8e-5, a mark still cost 7.1 nats after 25 steps (its rows 0.005 apart).
    Returns the new tokens' mean NLL on those windows after the fit."""
    device = next(model.parameters()).device
    batch = torch.from_numpy(sampler.sample(np.random.default_rng(0), windows, augment=False)).to(device)
    h, logits = _states_and_logits(model, batch)
    target = batch[:, 1:].flatten()
    keep = target != pad_id
    h, logits, target = h[keep], logits[keep], target[keep]
    idx = torch.tensor(rows, device=device)
    start = model.tok.weight[idx].detach().float()
    extra = logits[:, idx] - h @ start.T  # what the output heads add to the new tokens' logits
    others = logits.index_fill(1, idx, float("-inf")).logsumexp(-1)
    new_index = torch.full((model.cfg.vocab_size,), -1, device=device, dtype=torch.long)
    new_index[idx] = torch.arange(len(rows), device=device)
    is_new = new_index[target] >= 0
    old_target = logits.gather(1, target[:, None])[:, 0]
    weight = start.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([weight], lr=1e-2)
    for step in range(steps + 1):  # (the last pass only measures)
        with torch.enable_grad():
            new = h @ weight.T + extra
            nll = torch.logaddexp(others, new.logsumexp(-1)) - torch.where(
                is_new, new.gather(1, new_index[target].clamp(min=0)[:, None])[:, 0], old_target)
            if step < steps:
                optimizer.zero_grad()
                (nll.mean() + pull * (weight - start).square().sum()).backward()
                optimizer.step()
    with torch.no_grad():
        model.tok.weight[idx] = weight.detach().to(model.tok.weight.dtype)
    model.train()
    return float(nll.detach()[is_new].mean()) if is_new.any() else float("nan")


def bar_echo_config(tokenizer: REMITokenizer, bars: int = 1) -> dict:
    """The model config fields of a bar echo over the tokenizer's bars and positions, `bars` back."""
    return {"bar_echo": [tokenizer.bar_id, *tokenizer.range("Position")], "echo_bars": bars}


def pitch_memory_config(tokenizer: REMITokenizer) -> dict:
    """The model config fields of a pitch memory over the tokenizer's parts."""
    if not tokenizer.config.parts:
        raise OptionError("{pitch_memory} needs parts in the tokens: add {parts}")
    lo, hi = tokenizer.range("Pitch")
    return {"pitch_memory": [tokenizer.token_to_id[f"Program_{p}"] for p in PARTS], "pitch_range": [lo, hi]}


def interval_head_config(tokenizer: REMITokenizer) -> dict:
    """The model config fields of an interval head over the tokenizer's parts."""
    if not tokenizer.config.parts:
        raise OptionError("{interval_head} needs parts in the tokens: add {parts}")
    lo, hi = tokenizer.range("Pitch")
    return {"interval_head": [tokenizer.token_to_id[f"Program_{p}"] for p in PARTS], "pitch_range": [lo, hi],
            "bar_id": tokenizer.bar_id}


# the bars back the echo head reads: a bar, two, a phrase of four and of eight (pop's repeats)
ECHO_HEAD_LAGS = [1, 2, 4, 8]


# the candidates the echo head scores from tables of their own: in POP909's repeats the bar's
# candidate pitch is the next token 0.81 of the time, its velocity 0.49 (docs/design.md)
ECHO_KINDS = ("Position", "Pitch", "Velocity", "Duration")


def echo_head_config(bar_echo: bool, tokenizer: REMITokenizer) -> dict:
    """The model config fields of an echo head, for a model with (`bar_echo`) or without the bar echo."""
    if not bar_echo:
        raise OptionError("{echo_head} needs the bar echo: add {bar_echo}")
    return {"echo_head": ECHO_HEAD_LAGS, "echo_kinds": [list(tokenizer.range(kind)) for kind in ECHO_KINDS]}


def melody_head_config(bar_echo: bool, tokenizer: REMITokenizer) -> dict:
    """The model config fields of a melody head (spemusic.nn.recall.melody_reads): the bridge's and
    the piano's pitches read the melody, the chords (with chord tokens) its pitch classes."""
    if not tokenizer.config.melody_first:
        raise OptionError("{melody_head} needs each bar's melody first: add {melody_first}")
    if not bar_echo:
        raise OptionError("{melody_head} needs the bar echo: add {bar_echo}")
    parts = [tokenizer.token_to_id[f"Program_{p}"] for p in PARTS]
    durations = [tokenizer.range("Duration")[0], *(int(s) for s in tokenizer.duration_steps)]
    chords = [tokenizer.range("Chord")[0], len(QUALITIES)] if tokenizer.config.chords else []
    return {"melody_head": parts, "melody_durations": durations, "melody_chords": chords,
            "pitch_range": list(tokenizer.range("Pitch"))}


# the bars the bar clock tells apart (recall.bar_clock): POP909's melody enters by bar 12 in nine
# songs in ten, and a 2,048-token window from a song's start reaches bar 20 or so
CLOCK_BARS = 16
# the bars of rest the rest clock tells apart: past a few, a song is in an interlude
REST_BARS = 8


def bar_clock_config(tokenizer: REMITokenizer) -> dict:
    """The model config field of a bar clock (spemusic.nn.recall.bar_clock), with parts also
    counting the bars since the melody entered and since it last played."""
    melody = [tokenizer.token_to_id["Program_melody"], REST_BARS] if tokenizer.config.parts else []
    return {"bar_clock": [tokenizer.bos_id, tokenizer.bar_id, CLOCK_BARS, *melody]}


def key_head_config(tokenizer: REMITokenizer) -> dict:
    """The model config fields of a key head (spemusic.nn.recall.pitch_profile): the parts'
    pitches, and the chords (with chord tokens), scored by the pitch classes the parts have
    sounded so far."""
    if not tokenizer.config.parts:
        raise OptionError("{key_head} needs parts in the tokens: add {parts}")
    chords = [tokenizer.range("Chord")[0], len(QUALITIES)] if tokenizer.config.chords else []
    return {"key_head": [tokenizer.token_to_id[f"Program_{p}"] for p in PARTS], "key_chords": chords,
            "pitch_range": list(tokenizer.range("Pitch"))}


def repeat_marks_config(tokenizer: REMITokenizer) -> list:
    """The model config's repeat_marks: [id, lag] of each of the tokenizer's Repeat marks."""
    return [[i, lag] for i, lag in enumerate(tokenizer.mark_lags.tolist(), start=tokenizer.range("Repeat")[0])]


# the rows a fine-tune that adds the parts starts them from: the piano program POP909 was written in
PART_ROWS_LIKE = {"Program_melody": "Program_0", "Program_bridge": "Program_0", "Program_piano": "Program_0"}

def widened(model: Performer, cfg: ModelConfig) -> Performer:
    """The same model under `cfg`, which may widen its short convolution (the farther taps at
    zero) and add the stream features it lacks (spemusic.nn.recall; their tables at zero): it
    computes the same function until training moves the new weights."""
    k0, k = model.cfg.short_conv, cfg.short_conv
    if k < k0:
        raise OptionError("the model has a short convolution of {k0} tokens; {short_conv} {k} cannot shorten it "
                          "(it can only widen it)", k0=k0, k=k)
    with torch.random.fork_rng(devices=[]):  # the run draws the same SPE codes as without it
        new = Performer(cfg).to(model.device)
    state = {n: v for n, v in model.state_dict().items() if not n.endswith(".shift")}
    widen_echo_head = model.echo_head is not None and new.echo_head.weight.shape != model.echo_head.weight.shape
    if widen_echo_head:
        state.pop("echo_head.weight")
    missing, unexpected = new.load_state_dict(state, strict=False)
    added = (RECALL_PARAMETERS + INTERVAL_PARAMETERS + ECHO_HEAD_PARAMETERS + MELODY_HEAD_PARAMETERS + KEY_HEAD_PARAMETERS
             + KEY_CHORD_PARAMETERS)
    assert not unexpected and all(n.endswith(".shift") or n in added for n in missing), (missing, unexpected)
    with torch.no_grad():
        if widen_echo_head:  # the Repeat marks' table and each kind's start as the head's own: nothing changes
            old, w = model.cfg, cfg.echo_window + 1
            tables = model.echo_head.weight.view(len(old.echo_head), len(old.echo_kinds) + 1, old.echo_tables, w)
            new.echo_head.weight.copy_(tables.expand(-1, len(cfg.echo_kinds) + 1, cfg.echo_tables, w).flatten(1))
        for old_block, new_block in zip(model.blocks, new.blocks):
            if old_block.shift is not None:  # tap j-1 weighs the token j back: the near taps carry over
                new_block.shift[:k0] = old_block.shift
    return new


def with_short_conv(model: Performer, k: int) -> Performer:
    """The same model with a short convolution of `k` tokens: added at zero, or widened from a
    shorter one with its farther taps at zero (`widened`)."""
    return widened(model, replace(model.cfg, short_conv=k))


def lr_lambda(warmup: int, total: int, floor: float = 0.1):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return f


def decay_groups(model: torch.nn.Module, legacy: bool = False) -> tuple[list, list]:
    """(parameters with weight decay, parameters without): decay on the weight matrices and
    convolution taps, none on embeddings, gains, biases, nor on the positional encoding's own
    parameters (sine frequencies, phases and gains, conv kernels, gates), which are not weights
    that decay towards 0 should shrink: decayed, the gates of the shipped pop-piano stayed at
    sigmoid(0) = 0.5. `legacy`: the rule of runs before 2026-12-02, which decayed those too (so
    that such runs resume exactly as they were going)."""
    from ..nn.spe import SPE, SPEFilter

    positional = {id(p) for m in model.modules() if isinstance(m, (SPE, SPEFilter)) for p in m.parameters()}
    decays = [p.dim() >= 2 and "embed" not in n and (legacy or id(p) not in positional)
              for n, p in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    return [p for p, d in zip(params, decays) if d], [p for p, d in zip(params, decays) if not d]


# The stream features' tables (spemusic.nn.recall) start at zero, usually in a model fine-tuned
# gently: at the model's learning rate they would take thousands of steps to say anything (100
# steps at 8e-5 left pop-piano's melody intervals as they were), so they learn faster
# (TrainConfig.recall_lr_scale times the rate).
RECALL_PARAMETERS = ("pitch_memory.weight", "bar_echo.weight", "bar_clock.weight", "melody_clock.weight",
                     "rest_clock.weight")
# The interval head is a table of a few hundred scores, each read by thousands of notes a step: it
# needs scores near a nat apart within a fine-tune of a few hundred steps at the lineage's low rate.
INTERVAL_PARAMETERS, INTERVAL_LR_SCALE = ("interval_head.weight",), 100.0
# The echo head is smaller still (a score per lag and agreement, read by every token), and its
# scores must reach several nats (a copy that held for 16 tokens) within a hundred steps.
ECHO_HEAD_PARAMETERS, ECHO_HEAD_LR_SCALE = ("echo_head.weight",), 600.0
# The melody head's tables (an interval's score per part, a pitch class's per chord quality) start
# at zero and must reach nats within a few hundred steps; a chord's score is its table against the
# fraction of the bar each pitch class sounds, so its entries must reach several nats: at the
# interval head's rate they had moved 0.3 in 60 steps, still growing in a straight line.
MELODY_HEAD_PARAMETERS, MELODY_HEAD_LR_SCALE = ("melody_head.weight", "chord_head.weight"), 600.0
# The key head's 12 weights a part each weigh log shares (a few nats apart): a weight near 1 sharpens
# the scale by its own odds, so they must move by about one within a few hundred steps.
KEY_HEAD_PARAMETERS, KEY_HEAD_LR_SCALE = ("key_head.weight",), 300.0
# Its chord table is read by the chords alone, one token in 80: at the pitches' rate it had moved
# 0.05-0.09 in 100 steps, where a few tenths separate the chords of the key from the others.
KEY_CHORD_PARAMETERS, KEY_CHORD_LR_SCALE = ("key_chords.weight",), 3000.0


def build_optimizer(model: Performer, lr: float, weight_decay: float, device: torch.device,
                    recall_lr_scale: float = 10.0) -> torch.optim.AdamW:
    """AdamW with weight decay where `decay_groups` puts it, and the stream features' tables in a
    group of their own (no decay, `recall_lr_scale` times the rate). Fused (one kernel over all
    tensors) on CPUs as on GPUs: on a CPU the default foreach form took several times longer per
    optimizer step."""
    recall = [p for n, p in model.named_parameters() if n in RECALL_PARAMETERS]
    intervals = [p for n, p in model.named_parameters() if n in INTERVAL_PARAMETERS]
    melody_head = [p for n, p in model.named_parameters() if n in MELODY_HEAD_PARAMETERS]
    echo_head = [p for n, p in model.named_parameters() if n in ECHO_HEAD_PARAMETERS]
    key_head = [p for n, p in model.named_parameters() if n in KEY_HEAD_PARAMETERS]
    key_chords = [p for n, p in model.named_parameters() if n in KEY_CHORD_PARAMETERS]
    own = {id(p) for p in recall + intervals + echo_head + melody_head + key_head + key_chords}
    decay, no_decay = ([p for p in group if id(p) not in own] for group in decay_groups(model))
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if recall:
        groups.append({"params": recall, "weight_decay": 0.0, "lr": lr * recall_lr_scale})
    if intervals:
        groups.append({"params": intervals, "weight_decay": 0.0, "lr": lr * INTERVAL_LR_SCALE})
    if echo_head:
        groups.append({"params": echo_head, "weight_decay": 0.0, "lr": lr * ECHO_HEAD_LR_SCALE})
    if melody_head:
        groups.append({"params": melody_head, "weight_decay": 0.0, "lr": lr * MELODY_HEAD_LR_SCALE})
    if key_head:
        groups.append({"params": key_head, "weight_decay": 0.0, "lr": lr * KEY_HEAD_LR_SCALE})
    if key_chords:
        groups.append({"params": key_chords, "weight_decay": 0.0, "lr": lr * KEY_CHORD_LR_SCALE})
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=device.type in ("cuda", "cpu"))


def lm_loss(model, batch: torch.Tensor, pad_id: int, inputs: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """Mean next-token NLL over non-PAD targets, and their count. `inputs` (default: the batch
    itself) may differ from the batch where the model is fed its own draws."""
    logits = model(batch[:, :-1] if inputs is None else inputs[:, :-1])
    targets = batch[:, 1:]
    loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=pad_id, reduction="sum")
    count = int((targets != pad_id).sum())
    return loss / max(count, 1), count


# the tokens a model's own draws replace under --scheduled-sampling: a note's pitch, duration and
# velocity (never a Bar, Position or mark, so the stream keeps its structure)
OWN_DRAW_KINDS = ("Pitch", "Duration", "Velocity")


def own_draw_kinds(tokenizer: REMITokenizer) -> torch.Tensor:
    """(V,) each id's kind among OWN_DRAW_KINDS, counted from 1; 0 for a token no draw replaces."""
    kind = torch.zeros(len(tokenizer), dtype=torch.long)
    for i, name in enumerate(OWN_DRAW_KINDS, start=1):
        lo, hi = tokenizer.range(name)
        kind[lo:hi] = i
    return kind


@torch.no_grad()
def with_own_draws(model: Performer, batch: torch.Tensor, kind: torch.Tensor, share: float,
                   generator: torch.Generator) -> torch.Tensor:
    """Parallel scheduled sampling (Duckworth et al., 2019): the batch with `share` of its note
    tokens (`kind` > 0, own_draw_kinds) replaced by the model's own draws (at temperature 1, from
    its teacher-forced odds, each within its kind). Trained on these inputs against the true next
    tokens, the model learns to go on with the song after a token of its own that differs, as it
    must when it samples: a repeat then goes on after one wrong note instead of following it."""
    kind = kind.to(batch.device)
    targets = batch[:, 1:]
    pick = (kind[targets] > 0) & (torch.rand(targets.shape, generator=generator).to(batch.device) < share)
    if not pick.any():
        return batch
    logits = model(batch[:, :-1]).float()[pick]
    logits = logits.masked_fill(kind != kind[targets[pick]][:, None], float("-inf"))
    draws = torch.multinomial(torch.softmax(logits, dim=-1).cpu(), 1, generator=generator).squeeze(1)
    out = batch.clone()
    out[:, 1:][pick] = draws.to(batch.device)
    return out


@torch.no_grad()
def evaluate_windows(model: Performer, windows: np.ndarray, pad_id: int, device, dtype,
                     batch_size: int = 8, seed: int = 0) -> float:
    """Mean NLL per token over fixed windows, with one fixed SPE draw (deterministic)."""
    was_training = model.training
    model.eval()
    model.resample(seed)
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        batch = torch.from_numpy(windows[i: i + batch_size]).to(device)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss, n = lm_loss(model, batch, pad_id)
        total += float(loss) * n
        count += n
    model.train(was_training)
    return total / max(count, 1)


# ----------------------------------------------------------------------------- distributed

def dist_info() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0"))


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


# ----------------------------------------------------------------------------- run folder

class Logger:
    """metrics.jsonl (one JSON object per log step) on rank 0."""

    def __init__(self, path: Path | None):
        self.path = path

    def log(self, record: dict) -> None:
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


def _warnings(cfg: TrainConfig, cache, has_valid: bool) -> list[OptionWarning]:
    """Options that run but are probably not what the user meant."""
    out = []
    if cfg.warmup >= cfg.steps:
        out.append(OptionWarning("{warmup} {n} is not shorter than the run ({total}): the learning rate "
                                 "never reaches {lr} {rate:g}", n=cfg.warmup, total=count(cfg.steps, "step"), rate=cfg.lr))
    longest = max(f["length"] for f in cache.files("train"))
    if cfg.seq_len > longest:
        out.append(OptionWarning("{seq_len} {n} is longer than every training piece (longest {longest:,} tokens): "
                                 "windows are partly padding, which tokens/s counts", n=cfg.seq_len, longest=longest))
    if not has_valid:
        out.append(OptionWarning("no valid split in the data: no validation loss and no `best` checkpoint"))
    return out


def activation_bytes_per_token(cfg: ModelConfig, checkpoint_activations: bool = False) -> int:
    """A rough upper estimate of the training step's memory per token of a micro-batch: each
    layer keeps ~16 d_model, 3 d_ff and 4 heads x features floats for the backward pass (checked
    against the training step's peak memory that benchmarks/attention.py measures)."""
    per_layer = 16 * cfg.d_model + 3 * cfg.d_ff + 4 * cfg.n_heads * cfg.n_features
    layers = 1 if checkpoint_activations else cfg.n_layers
    return 4 * (per_layer * layers + 3 * cfg.vocab_size)


def check_memory(cfg: ModelConfig, micro_batch: int, seq_len: int, checkpoint_activations: bool, device,
                 valid_windows: int) -> None:
    """Refuse, before allocating anything, a step that cannot fit: --batch-size 10^9 would
    otherwise fail deep inside torch."""
    need = micro_batch * seq_len * activation_bytes_per_token(cfg, checkpoint_activations) + valid_windows * seq_len * 8
    free = available_memory(device)
    if free is not None and need > free:
        raise OptionError("a micro-batch of {micro:,} x {length:,} tokens would need ~{need:,.1f} GB; {free:,.1f} GB "
                          "are free: lower {batch_size} or {seq_len} ({grad_accum} keeps the tokens per step), or add "
                          "{checkpoint_activations}", micro=micro_batch, length=seq_len, need=need / 2**30,
                          free=free / 2**30)


def lock_run_folder(run_dir: Path):
    """One writer per run folder: an exclusive flock on RUN/.lock, released when the process ends
    however it ends (two writers would interleave metrics.jsonl and overwrite each other's
    checkpoints). Returns the open lock file, to keep for the run."""
    try:
        import fcntl
    except ImportError:  # not on POSIX: no lock
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    fh = open(run_dir / ".lock", "a+b", buffering=0)  # unbuffered: a full disk fails the write, not a later close
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().decode(errors="replace").strip() or "another process"
        fh.close()
        raise OptionError("{folder}: another spemusic train ({holder}) is writing this run; stop it first, or give "
                          "another {run_dir}", folder=run_dir, holder=holder) from None
    try:
        fh.truncate(0)
        fh.write(f"pid {os.getpid()}".encode())
    except OSError as e:  # a full disk: the run could not save anything either
        fh.close()
        raise SpemusicError(f"{run_dir / '.lock'}: cannot write ({e.strerror}); a run needs room for its checkpoints") from None
    return fh


def read_run_record(run_file: Path) -> dict:
    """RUN/run.json, checked: its train options, model and tokenizer configs (errors name the file
    and what is wrong, not the first key a later line looks up)."""
    try:
        record = json.loads(run_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpemusicError(f"{run_file}: not a run record ({e})") from None
    if not isinstance(record, dict):
        raise SpemusicError(f"{run_file}: not a run record (not a JSON object)")
    for key in ("train", "model", "tokenizer"):
        if not isinstance(record.get(key), dict):
            raise SpemusicError(f"{run_file}: broken run record (no {key!r} mapping)")
    try:
        ModelConfig.from_dict(record["model"])
        TokenizerConfig.from_dict(record["tokenizer"])
    except (SpemusicError, TypeError) as e:
        raise SpemusicError(f"{run_file}: {e}") from None
    return record


def _record_step(line: str) -> int | None:
    """The step of a metrics.jsonl line, None when the line is not a record."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        return None
    step = rec.get("step") if isinstance(rec, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None




# ----------------------------------------------------------------------------- resolving the run

@dataclass
class Run:
    """A run resolved: the options it trains with and its folder; a resumed run also its record."""
    cfg: TrainConfig
    run_dir: Path
    record: dict | None = None  # RUN/run.json of a resumed run
    lock: Any = None            # the folder's lock (lock_run_folder), held while the run trains

    @property
    def resumed(self) -> bool:
        return self.record is not None

    @property
    def last(self) -> Path:
        """The checkpoint a resumed run continues from."""
        return (self.run_dir / "last").resolve()


def resolve_run(cfg: TrainConfig | dict, run_dir: str | Path, resume: bool = False, is_main: bool = True,
                events: TrainEvents | None = None) -> Run:
    """The run `train` trains, with every rule of resuming. A fresh run takes `cfg` and a folder
    that holds no run. A resumed run keeps the options of its record: `cfg` holds the options given
    again, of which only `steps` applies (to grow the run). On the main process, a resumed run's
    folder is locked here; a fresh run's only once it starts writing (see `_start_run_folder`)."""
    run_dir = Path(run_dir)
    if resume:
        return _resolve_resumed(cfg, run_dir, is_main, events or TrainEvents())
    cfg = replace(cfg) if isinstance(cfg, TrainConfig) else TrainConfig.from_dict(cfg)
    cfg.check()
    cfg.data = str(Path(cfg.data).resolve())  # the run's record must hold from any working folder
    cfg.beats, cfg.chords = (str(Path(p).resolve()) if p else "" for p in (cfg.beats, cfg.chords))
    check_output_folder(run_dir)
    if (run_dir / "last").exists():
        raise OptionError("{folder}: already holds a training run; use {resume} {folder} or another {run_dir}",
                          folder=run_dir)
    kept = checkpoint.complete_checkpoints(run_dir)
    if kept:  # a run whose links were lost: starting afresh would delete them
        raise OptionError("{folder}: holds {n} complete checkpoint(s) ({newest} the newest); use {resume} {folder} "
                          "or another {run_dir}", folder=run_dir, n=len(kept), newest=kept[-1].relative_to(run_dir))
    return Run(cfg, run_dir)


def _resolve_resumed(given: TrainConfig | dict, run_dir: Path, is_main: bool, events: TrainEvents) -> Run:
    if isinstance(given, TrainConfig):  # the options set, as a dict of those given would hold
        given = {f.name: getattr(given, f.name) for f in fields(given) if getattr(given, f.name) != f.default}
    ignored = [name for name in given if name != "steps"]
    if ignored:
        raise OptionError("{resume} continues {folder} with its own options; drop "
                          + ", ".join("{%s}" % name for name in ignored) + " (only {steps} and {stop_after} apply)",
                          folder=run_dir)
    run_file = run_dir / "run.json"
    if not run_file.is_file():
        raise SpemusicError(f"{run_dir}: nothing to resume (not a training run: no run.json)")
    lock = lock_run_folder(run_dir) if is_main else None
    if not (run_dir / "last").exists():
        found = checkpoint.relink_last(run_dir) if is_main else None
        if found is None and not checkpoint.complete_checkpoints(run_dir):
            raise OptionError("{folder}: nothing to resume (the run stopped before its first checkpoint); start it "
                              "again: train … {run_dir} with the same folder", folder=run_dir)
        if found is not None:
            events.note(f"{run_dir}: `last` was missing; resuming from the newest complete checkpoint, "
                        f"{found.relative_to(run_dir)}")
    record = read_run_record(run_file)
    cfg = TrainConfig.from_dict(record["train"], source=str(run_file))
    cache = record.get("data_cache")
    if cache and not Path(cfg.data).exists() and Path(cache).is_dir():
        cfg.data = cache  # a run recorded with a relative DATA, resumed elsewhere
    steps = given.get("steps", 0)
    if steps and steps < cfg.steps:
        raise OptionError("{steps} {n} is below the run's {total}: a resumed run can only grow (stop it "
                          "earlier with {stop_after})", n=steps, total=count(cfg.steps, "step"))
    cfg.steps = steps or cfg.steps
    cfg.epochs = 0.0  # a run started with epochs recorded the steps they came to
    cfg.check()
    return Run(cfg, run_dir, record, lock)


def setup_device(cfg: TrainConfig, world: int, local_rank: int) -> torch.device:
    """The run's device; under torchrun, this process's GPU and the process group."""
    device = pick_device(cfg.device)
    if world > 1:
        if device.type == "cuda":
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if cfg.batch_size % world:
            raise OptionError("{batch_size} {n} must be divisible by the {world} processes", n=cfg.batch_size,
                              world=world)
    return device


def _starting_point(run: Run) -> tuple[TokenizerConfig, Performer | None]:
    """The tokenizer config the data is read with, and the model a fine-tune starts from (its
    config, weights and tokenizer)."""
    if run.resumed:  # the run's own record: also right for fine-tuning runs (checked by read_run_record)
        return TokenizerConfig.from_dict(run.record["tokenizer"]), None
    cfg = run.cfg
    if cfg.melody_first and not cfg.parts:
        raise OptionError("{melody_first} needs {parts}")
    if cfg.init_from:
        base_model, base_tokenizer = checkpoint.load_model(cfg.init_from)
        if cfg.parts and not base_tokenizer.config.parts:  # the parts join the model's vocabulary
            wider = REMITokenizer(replace(base_tokenizer.config, parts=True, melody_first=cfg.melody_first))
            return wider.config, with_vocabulary(base_model, base_tokenizer, wider, PART_ROWS_LIKE)
        # the same tokens in another layout: melody first, a chord on every bar, the drums on the grid
        switched = {flag: True for flag in ("melody_first", "chord_every_bar", "drum_grid") if getattr(cfg, flag)}
        config = replace(base_tokenizer.config, **switched)
        marks = {flag: True for flag in ("repeats", "copies") if getattr(cfg, flag) and not getattr(config, flag)}
        if marks:  # the Repeat marks (or copy marks) join the model's vocabulary
            marked = replace(config, **marks)
            check_layout(marked.parts, marked.melody_first, marked.chords, marked.chord_every_bar, marked.repeats,
                         marked.copies)
            marked = REMITokenizer(marked)
            return marked.config, with_vocabulary(base_model, base_tokenizer, marked, {})
        return config, base_model
    check_layout(cfg.parts, cfg.melody_first, bool(cfg.chords), cfg.chord_every_bar, cfg.repeats, cfg.copies)
    return TokenizerConfig(chords=bool(cfg.chords), parts=cfg.parts, melody_first=cfg.melody_first,
                           chord_every_bar=cfg.chord_every_bar, drum_grid=cfg.drum_grid, repeats=cfg.repeats,
                           copies=cfg.copies), None


def _open_cache(cfg: TrainConfig, tok_cfg: TokenizerConfig, world: int, is_main: bool) -> TokenCache:
    """The run's token cache: rank 0 prepares it if needed, the others then read it."""
    annotations = dict(beats_dir=Path(cfg.beats) if cfg.beats else None,
                       chords_dir=Path(cfg.chords) if cfg.chords else None)
    if is_main:
        cache = open_dataset(Path(cfg.data), tok_cfg, **annotations)
    _barrier(world)
    if not is_main:
        cache = open_dataset(Path(cfg.data), tok_cfg, **annotations)
    return cache


# ----------------------------------------------------------------------------- the model

def model_config(run: Run, base_model: Performer | None, tokenizer: REMITokenizer) -> ModelConfig:
    """The config of the model a run trains: its record's when resumed; a fine-tune's starting
    model's, widened to `short_conv`; else the preset with the run's options. A fine-tune's
    options take the model's pe, gated, attention, max_len and preset here, for its record."""
    cfg = run.cfg
    if run.resumed:
        return ModelConfig.from_dict(run.record["model"])
    if base_model is None:
        recall = {**(pitch_memory_config(tokenizer) if cfg.pitch_memory else {}),
                  **(interval_head_config(tokenizer) if cfg.interval_head else {}),
                  **(bar_echo_config(tokenizer, cfg.echo_bars) if cfg.bar_echo else {}),
                  **(echo_head_config(cfg.bar_echo, tokenizer) if cfg.echo_head else {}),
                  **({"repeat_marks": repeat_marks_config(tokenizer)} if cfg.bar_echo and cfg.repeats else {}),
                  **(melody_head_config(cfg.bar_echo, tokenizer) if cfg.melody_head else {}),
                  **(bar_clock_config(tokenizer) if cfg.bar_clock else {}),
                  **(key_head_config(tokenizer) if cfg.key_head else {})}
        extra = {"short_conv": cfg.short_conv} if cfg.short_conv >= 0 else {}
        extra.update({"dropout": cfg.dropout} if cfg.dropout >= 0 else {})
        return ModelConfig.preset(cfg.preset, vocab_size=len(tokenizer), **recall, pe=cfg.pe, gated=cfg.gated,
                                  attention=cfg.attention, max_len=cfg.max_len or max(cfg.seq_len, 2048), **extra)
    model_cfg = base_model.cfg
    if cfg.short_conv >= 0 and cfg.short_conv != model_cfg.short_conv:
        if cfg.short_conv < model_cfg.short_conv:
            raise OptionError("{model} has a short convolution of {k0} tokens; {short_conv} {k} cannot shorten it "
                              "(it can only widen it)", model=cfg.init_from, k0=model_cfg.short_conv, k=cfg.short_conv)
        model_cfg = replace(model_cfg, short_conv=cfg.short_conv)
    if cfg.pitch_memory and not model_cfg.pitch_memory:  # (a model that has them keeps its own)
        model_cfg = replace(model_cfg, **pitch_memory_config(tokenizer))
    if cfg.dropout >= 0:
        model_cfg = replace(model_cfg, dropout=cfg.dropout)
    if cfg.interval_head and not model_cfg.interval_head:
        model_cfg = replace(model_cfg, **interval_head_config(tokenizer))
    if cfg.bar_echo:  # added, or read over `echo_bars` bars from now on
        model_cfg = replace(model_cfg, **bar_echo_config(tokenizer, cfg.echo_bars))
    if cfg.echo_head and not model_cfg.echo_kinds:  # added, or its tables by kind added
        model_cfg = replace(model_cfg, **echo_head_config(bool(model_cfg.bar_echo), tokenizer))
    if tokenizer.config.repeats and model_cfg.bar_echo and len(model_cfg.repeat_marks) != len(tokenizer.mark_lags):
        model_cfg = replace(model_cfg, repeat_marks=repeat_marks_config(tokenizer))  # added, or the copy marks added
    if cfg.melody_head and not model_cfg.melody_head:
        model_cfg = replace(model_cfg, **melody_head_config(bool(model_cfg.bar_echo), tokenizer))
    clock = bar_clock_config(tokenizer) if cfg.bar_clock else {}
    if clock and len(model_cfg.bar_clock) < len(clock["bar_clock"]):
        model_cfg = replace(model_cfg, **clock)  # added, or its melody or rest clock added
    if cfg.key_head and (not model_cfg.key_head or tokenizer.config.chords and not model_cfg.key_chords):  # (or its chords)
        model_cfg = replace(model_cfg, **key_head_config(tokenizer))
    if model_cfg.has_absolute_pe and cfg.seq_len > model_cfg.max_len:
        raise OptionError("{seq_len} {n} is past {model}'s absolute positions ({limit}); SPE models have no such "
                          "limit", n=cfg.seq_len, model=cfg.init_from, limit=model_cfg.max_len)
    cfg.pe, cfg.gated, cfg.attention = model_cfg.pe, model_cfg.gated, model_cfg.attention
    cfg.max_len = model_cfg.max_len
    size = lambda c: (c.n_layers, c.d_model, c.n_heads, c.d_ff)  # noqa: E731
    cfg.preset = next((n for n in PRESETS if size(ModelConfig.preset(n, vocab_size=1)) == size(model_cfg)), "custom")
    return model_cfg


def build_model(run: Run, model_cfg: ModelConfig, base_model: Performer | None, device: torch.device) -> Performer:
    """The model of `model_cfg` as the run starts it: fresh (from the run's seed), the fine-tuned
    model (`widened` to the short convolution and stream features of `model_cfg`), or with the
    weights of the resumed run's `last`."""
    torch.manual_seed(run.cfg.seed)
    if base_model is not None:
        model = base_model.to(device)
        if model_cfg != model.cfg:
            model = widened(model, model_cfg)
    else:
        model = Performer(model_cfg).to(device)
    if run.resumed:
        import safetensors.torch

        weights = run.last / checkpoint.WEIGHTS
        try:
            safetensors.torch.load_model(model, str(weights), strict=False, device=str(device))
        except Exception as e:  # noqa: BLE001 - wrong shapes, a truncated or foreign file
            raise SpemusicError(f"{weights}: weights do not fit the run's model "
                                f"({checkpoint.first_problem(e)})") from None
    model.checkpoint_activations = run.cfg.checkpoint_activations
    return model


def autocast_dtype(cfg: TrainConfig, device: torch.device, model_cfg: ModelConfig,
                   world: int) -> tuple[torch.dtype, str]:
    """pick_dtype for the run's micro-batch; under torchrun every process takes rank 0's choice."""
    dtype, reason = pick_dtype(cfg.precision, device, model_cfg, cfg.batch_size // world, cfg.seq_len)
    if world > 1 and reason.startswith("auto: measured"):
        choice = torch.tensor([dtype == torch.bfloat16], dtype=torch.int64)
        dist.broadcast(choice, 0)
        dtype = torch.bfloat16 if int(choice) else torch.float32
    return dtype, reason


def build_optimizer_and_scheduler(model: Performer, cfg: TrainConfig, device: torch.device):
    """AdamW (build_optimizer) and its warmup/cosine schedule over the run's steps."""
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay, device, cfg.recall_lr_scale)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.warmup, cfg.steps))


# ----------------------------------------------------------------------------- trainer state

@dataclass
class RunState:
    """Where a run stands: saved in each checkpoint's trainer state, restored on resume."""
    rng: np.random.Generator    # draws the training windows
    step: int = 0
    best_valid: float = math.inf
    tokens: int = 0
    elapsed_before: float = 0.0  # seconds trained by the processes before this one


def trainer_state(state: RunState, optimizer, scheduler, device: torch.device, elapsed: float) -> dict:
    """A checkpoint's trainer.pt: what resuming needs besides the weights (read back by
    restore_trainer_state, just below; checkpoint.TRAINER_KEYS lists what it requires)."""
    saved = {
        "format": checkpoint.FORMAT, "step": state.step, "best_valid": state.best_valid, "tokens": state.tokens,
        "elapsed": elapsed, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "sampler_rng": json.dumps(state.rng.bit_generator.state), "torch_rng": torch.get_rng_state(),
    }
    if device.type == "cuda":
        saved["cuda_rng"] = torch.cuda.get_rng_state(device)
    return saved


def _legacy_groups_if_saved_so(optimizer, saved: dict, model: torch.nn.Module) -> None:
    """A run saved with the legacy decay rule (`decay_groups`) goes on with it: its optimizer
    state lists its parameters in that rule's groups."""
    sizes = [len(g["params"]) for g in saved.get("param_groups", [])]
    if sizes == [len(g["params"]) for g in optimizer.param_groups]:
        return
    legacy = decay_groups(model, legacy=True)
    if sizes == [len(group) for group in legacy]:
        for group, params in zip(optimizer.param_groups, legacy):
            group["params"] = params


def restore_trainer_state(run: Run, state: RunState, model: torch.nn.Module, optimizer, scheduler,
                          device: torch.device) -> None:
    """The trainer state of the resumed run's `last`, into `state`, the optimizer, the schedule and
    the random generators, so that the run goes on exactly as if it had not stopped."""
    last, cfg = run.last, run.cfg
    saved = checkpoint.load_trainer_state(last)
    try:
        _legacy_groups_if_saved_so(optimizer, saved["optimizer"], model)
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise SpemusicError(f"{last / checkpoint.TRAINER}: optimizer state does not fit the run's model "
                            f"({checkpoint.first_problem(e)})") from None
    # the schedule over this run's steps, which a resume may have grown
    scheduler.lr_lambdas = [lr_lambda(cfg.warmup, cfg.steps)] * len(optimizer.param_groups)
    state.rng.bit_generator.state = json.loads(saved["sampler_rng"])
    torch.set_rng_state(saved["torch_rng"])
    if device.type == "cuda" and "cuda_rng" in saved:
        torch.cuda.set_rng_state(saved["cuda_rng"], device)
    state.step, state.best_valid = int(saved["step"]), float(saved["best_valid"])
    if state.step >= cfg.steps:
        raise OptionError("{folder}: already trained for its {n}; give a larger {steps} to train further",
                          folder=run.run_dir, n=count(cfg.steps, "step"))
    state.tokens, state.elapsed_before = int(saved["tokens"]), float(saved["elapsed"])


def _drop_records_after(run_dir: Path, step: int, events: TrainEvents) -> None:
    """metrics.jsonl without the records written after the checkpoint (by the run that stopped):
    they are written again."""
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        lines = [line for line in metrics.read_text(errors="replace").splitlines() if line.strip()]
        kept = [line for line in lines if (_record_step(line) or step + 1) <= step]
        unreadable = sum(_record_step(line) is None for line in lines)
        if unreadable:
            events.note(f"{metrics}: dropped {unreadable} unreadable line(s)")
        metrics.write_text("".join(line + "\n" for line in kept))


def _start_run_folder(run: Run, model_cfg: ModelConfig, cache: TokenCache, world: int):
    """Lock a fresh run's folder and write its record; returns the lock."""
    lock = lock_run_folder(run.run_dir)
    (run.run_dir / "metrics.jsonl").unlink(missing_ok=True)
    write_atomically(json.dumps(  # never a half-written record on a full disk
        {"train": asdict(run.cfg), "model": model_cfg.to_dict(), "tokenizer": cache.tokenizer.config.to_dict(),
         "data_cache": str(cache.path), "world_size": world}, indent=2).encode(), run.run_dir / "run.json")
    return lock


# ----------------------------------------------------------------------------- the loop

class TrainEvents:
    """What `train` reports as it goes, on the main process only. Each method does nothing here:
    subclass it to show the run (the CLI prints these as its output)."""

    def note(self, text: str) -> None:
        """Something the run did that the user should know (a repaired run folder)."""

    def start(self, info: dict) -> None:
        """Before the first step. `info`: config (the TrainConfig resolved), run_dir, step (where a
        resumed run starts), parameters, tokens_per_step, device, dtype, dtype_reason, processes,
        data (the cache folder), splits (its files and tokens per split), warnings (OptionWarning
        list) and uncompiled (why the step's compiled regions run uncompiled, or None)."""

    def step(self, step: int, loss: float) -> None:
        """After each optimizer step: the steps done, and its loss."""

    def log(self, record: dict, tokens_per_s: float) -> None:
        """Each record written to metrics.jsonl (train loss, lr, tokens/s, valid loss)."""


@dataclass
class _Loop:
    """The training loop: optimizer steps, logs and validation, checkpoints."""
    run: Run
    model: Performer
    train_model: torch.nn.Module  # what the step calls: the model, wrapped by DDP and/or compiled
    optimizer: torch.optim.Optimizer
    scheduler: Any
    cache: TokenCache
    sampler: WindowSampler
    valid: np.ndarray | None
    device: torch.device
    dtype: torch.dtype
    state: RunState
    events: TrainEvents
    rank: int = 0
    world: int = 1
    logger: Logger = field(init=False)
    # the current log window, and what the last log and validation said
    window_loss: float = 0.0
    window_count: int = 0
    window_tokens: int = 0
    last_train_loss: float | None = None
    last_window: int = 0
    last_valid: float | None = None

    def __post_init__(self):
        self.cfg = self.run.cfg
        self.is_main = self.rank == 0
        self.logger = Logger(self.run.run_dir / "metrics.jsonl" if self.is_main else None)
        self.tokens_per_step = self.cfg.batch_size * self.cfg.grad_accum * self.cfg.seq_len
        self.pad_id = self.cache.tokenizer.pad_id
        self.n_params = self.model.num_parameters()
        self.trained_tokens = trained_vocabulary(self.cache, self.cfg.transpose)
        # the own draws of --scheduled-sampling: seeded by the run and the step it starts at (resumable)
        self.draws = torch.Generator().manual_seed(self.cfg.seed * 7_919 + self.state.step)
        self.draw_kinds = own_draw_kinds(self.cache.tokenizer).to(self.device)

    def run_until(self, end_step: int) -> dict:
        """Train up to `end_step`; returns the summary `train` returns."""
        cfg, state = self.cfg, self.state
        initial_loss = None
        self.t_start = self.t_window = time.perf_counter()
        self.model.train()
        while state.step < end_step:
            loss = self._optimizer_step()
            if initial_loss is None:
                initial_loss = loss
            self.window_loss += loss
            self.window_count += 1
            self.window_tokens += self.tokens_per_step
            self.events.step(state.step, loss)
            do_val = self.valid is not None and (state.step % cfg.val_every == 0 or state.step == cfg.steps)
            if state.step % cfg.log_every == 0 or do_val or state.step == end_step:
                self._log(do_val)
            if self.is_main:
                self._checkpoint(do_val, end_step)
            _barrier(self.world)
        best = state.best_valid if math.isfinite(state.best_valid) else None
        return {"steps": state.step, "total_steps": cfg.steps, "tokens": state.tokens, "initial_loss": initial_loss,
                "train_loss": self.last_train_loss, "train_loss_steps": self.last_window,
                "valid_loss": self.last_valid, "best_valid_loss": best,
                "wall_seconds": time.perf_counter() - self.t_start, "run_dir": str(self.run.run_dir)}

    def _optimizer_step(self) -> float:
        """One optimizer step over grad_accum micro-batches; returns its loss."""
        cfg, state, model = self.cfg, self.state, self.model
        if cfg.feature_redraw and state.step % cfg.feature_redraw == 0 and state.step > 0:
            # same generator on every rank: features stay identical across processes
            model.redraw_features(torch.Generator().manual_seed(cfg.seed * 1_000_003 + state.step))
        self.optimizer.zero_grad(set_to_none=True)
        micro = cfg.batch_size // self.world
        step_loss = 0.0
        for micro_step in range(cfg.grad_accum):
            batch = self.sampler.sample(state.rng, cfg.batch_size, augment=cfg.transpose > 0)
            batch = torch.from_numpy(batch[self.rank * micro:(self.rank + 1) * micro]).to(self.device)
            sync = micro_step == cfg.grad_accum - 1
            ctx = self.train_model.no_sync() if (self.world > 1 and not sync) else contextlib.nullcontext()
            with ctx, torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
                inputs = (with_own_draws(model, batch, self.draw_kinds, cfg.scheduled_sampling, self.draws)
                          if cfg.scheduled_sampling else None)
                loss, _ = lm_loss(self.train_model, batch, self.pad_id, inputs)
                (loss / cfg.grad_accum).backward()
            step_loss += loss.item() / cfg.grad_accum
        if not math.isfinite(step_loss):
            raise OptionError("training diverged at step {n} (loss {loss}); try a lower {lr}", n=state.step,
                              loss=step_loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        state.step += 1
        state.tokens += self.tokens_per_step
        return step_loss

    def _log(self, do_val: bool) -> None:
        """A metrics.jsonl record of the window's mean loss (over all processes), validated when due."""
        if self.world > 1:
            t = torch.tensor([self.window_loss], dtype=torch.float64, device=self.device)
            dist.all_reduce(t)
            self.window_loss = float(t) / self.world
        tps = self.window_tokens / max(time.perf_counter() - self.t_window, 1e-9)
        self.last_train_loss, self.last_window = self.window_loss / self.window_count, self.window_count
        record = {"step": self.state.step, "train_loss": round(self.last_train_loss, 5),
                  "lr": float(f"{self.scheduler.get_last_lr()[0]:.6g}"), "tokens_per_s": round(tps, 1),
                  "tokens": self.state.tokens}
        if do_val:
            self.last_valid = evaluate_windows(self.model, self.valid, self.pad_id, self.device, self.dtype)
            record["valid_loss"] = round(self.last_valid, 5)
        self.logger.log(record)
        self.events.log(record, tps)
        self.window_loss, self.window_count, self.window_tokens = 0.0, 0, 0
        self.t_window = time.perf_counter()

    def _checkpoint(self, do_val: bool, end_step: int) -> None:
        """Save `best` on a better validation loss, `last` every save_every steps and at the end."""
        state, names = self.state, []
        if do_val and self.last_valid is not None and self.last_valid < state.best_valid:
            state.best_valid = self.last_valid
            names.append("best")
        if state.step % self.cfg.save_every == 0 or state.step == end_step:
            names.append("last")
        if names:
            self._save(names)

    def _save(self, names: list[str]) -> None:
        state, cfg = self.state, self.cfg
        if not all(torch.isfinite(p).all() for p in self.model.parameters()):  # never saved as best or last
            raise OptionError("training diverged at step {n} (weights not finite); try a lower {lr}", n=state.step)
        info = {"step": state.step, "tokens": state.tokens, "train_loss": self.last_train_loss,
                "valid_loss": self.last_valid,
                "best_valid_loss": state.best_valid if math.isfinite(state.best_valid) else None,
                "seq_len": cfg.seq_len, "data": str(cfg.data), "preset": cfg.preset,
                "parameters": self.n_params, "trained_tokens": self.trained_tokens}
        elapsed = state.elapsed_before + (time.perf_counter() - self.t_start)
        checkpoint.save_run_checkpoint(self.run.run_dir, names, state.step, self.model, self.cache.tokenizer.config,
                                       info, trainer_state(state, self.optimizer, self.scheduler, self.device, elapsed))


# ----------------------------------------------------------------------------- train

def train(cfg: TrainConfig | dict, run_dir: str | Path, *, resume: bool = False, stop_after: int | None = None,
          events: TrainEvents | None = None) -> dict:
    """Train a model into `run_dir` with the options of `cfg` (a TrainConfig, or a dict of its
    fields), or with `resume`, continue the run there (`cfg` then holds the options given again:
    only `steps`, to grow the run). `stop_after`: stop after this many steps of this call.
    `events` receives the run's progress on the main process. Returns a summary: steps,
    total_steps, tokens, initial_loss, train_loss (the mean of the last train_loss_steps steps),
    valid_loss, best_valid_loss, wall_seconds, run_dir."""
    rank, world, local_rank = dist_info()
    is_main = rank == 0
    events = events if events is not None and is_main else TrainEvents()
    run = resolve_run(cfg, run_dir, resume, is_main, events)
    cfg = run.cfg
    device = setup_device(cfg, world, local_rank)
    tok_cfg, base_model = _starting_point(run)
    cache = _open_cache(cfg, tok_cfg, world, is_main)
    # the model's size, before its options are checked: a step that cannot fit is said first
    planned = (ModelConfig.from_dict(run.record["model"]) if run.resumed else base_model.cfg if base_model is not None
               else ModelConfig.preset(cfg.preset, vocab_size=len(cache.tokenizer)))
    check_memory(planned, max(cfg.batch_size // world, 1), cfg.seq_len, cfg.checkpoint_activations, device,
                 cfg.valid_windows)
    sampler = WindowSampler(cache, "train", cfg.seq_len, cfg.transpose, cfg.lead_sheet, cfg.piece_starts,
                            cfg.kit_swaps)
    has_valid = bool(cache.files("valid"))
    valid = fixed_windows(cache, "valid", cfg.seq_len, cfg.valid_windows) if has_valid else None
    tokens_per_step = cfg.batch_size * cfg.grad_accum * cfg.seq_len
    if cfg.steps <= 0:  # planned in epochs
        cfg.steps = max(1, math.ceil(cfg.epochs * cache.index["splits"]["train"]["tokens"] / tokens_per_step))

    model_cfg = model_config(run, base_model, cache.tokenizer)
    new_rows = getattr(base_model, "new_rows", [])
    model = build_model(run, model_cfg, base_model, device)
    if new_rows and not run.resumed:
        nll = fit_new_rows(model, sampler, new_rows, cache.tokenizer.pad_id)
        events.note(f"the {len(new_rows)} new tokens' rows fitted on the model's states: {nll:.3f} nats each")
    dtype, dtype_reason = autocast_dtype(cfg, device, model_cfg, world)
    optimizer, scheduler = build_optimizer_and_scheduler(model, cfg, device)
    state = RunState(rng=np.random.default_rng(cfg.seed))
    if run.resumed:
        restore_trainer_state(run, state, model, optimizer, scheduler, device)
        if is_main:
            _drop_records_after(run.run_dir, state.step, events)
    elif is_main:
        run.lock = _start_run_folder(run, model_cfg, cache, world)

    train_model = model
    if world > 1:
        train_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile:
        train_model = torch.compile(train_model)
    loop = _Loop(run, model, train_model, optimizer, scheduler, cache, sampler, valid, device, dtype, state, events,
                 rank, world)
    events.start({"config": cfg, "run_dir": run.run_dir, "step": state.step, "parameters": loop.n_params,
                  "tokens_per_step": tokens_per_step, "device": device, "dtype": dtype, "dtype_reason": dtype_reason,
                  "processes": world, "data": cache.path, "splits": cache.index["splits"],
                  "warnings": _warnings(cfg, cache, has_valid), "uncompiled": compiled.unavailable()})
    summary = loop.run_until(cfg.steps if stop_after is None else min(cfg.steps, state.step + stop_after))
    if world > 1:
        dist.destroy_process_group()
    return summary
