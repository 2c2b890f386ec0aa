"""Training loop: AdamW + warmup/cosine, bf16 autocast where it pays, validation, atomic
checkpoints, exact resume, and DistributedDataParallel when started by torchrun."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import checkpoint, compiled
from .data import WindowSampler, fixed_windows, open_dataset, trained_vocabulary
from .device import pick_device, pick_dtype
from .errors import SpemusicError
from .files import check_output_folder, write_atomically
from .memory import available_memory
from .model import ABSOLUTE_PE_OPTIONS, PE_OPTIONS, ModelConfig, Performer
from .tokenizer import TokenizerConfig

PRESETS = ("tiny", "small", "paper")
# what a TrainConfig field of each annotated type accepts (bool is an int to Python, not to a config)
_OPTION_TYPES = {"int": ((int,), "an integer"), "float": ((int, float), "a number"),
                 "bool": ((bool,), "true or false"), "str": ((str,), "a string")}


@dataclass
class TrainConfig:
    data: str = ""
    preset: str = "small"
    pe: str = "sinespe"
    gated: bool = True
    attention: str = "favor"
    seq_len: int = 1024
    batch_size: int = 8          # sequences per micro-batch, all processes together
    grad_accum: int = 1          # micro-batches per optimizer step
    steps: int = 0               # optimizer steps (0: derived from epochs)
    epochs: float = 0.0
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    feature_redraw: int = 1000   # FAVOR+ features redrawn every N steps (0: never)
    val_every: int = 200
    save_every: int = 200
    log_every: int = 10
    valid_windows: int = 64
    device: str = "auto"
    precision: str = "auto"
    compile: bool = False
    checkpoint_activations: bool = False  # recompute block activations in backward: less memory, ~1/3 more compute
    seed: int = 0
    transpose: int = 6
    max_len: int = 0             # positions of an absolute PE (0: max(seq_len, 2048)); SPE has no limit
    init_from: str = ""          # fine-tune: start from this model (shipped name or checkpoint), its config and tokenizer
    beats: str = ""              # folder of beat annotations for a MIDI folder DATA (bars from their downbeats)
    chords: str = ""             # folder of chord annotations (Chord tokens; a new model gets a chord vocabulary)
    short_conv: int = -1         # tokens each block's short convolution reaches back (-1: the preset's, or the
                                 # fine-tuned model's; a fine-tuned model without one gets it, starting at zero)

    def check(self) -> None:
        if self.preset not in PRESETS and not self.init_from:  # a fine-tune records its model's size
            raise SpemusicError(f"--preset must be one of {', '.join(PRESETS)} (got {self.preset!r})")
        if self.pe not in PE_OPTIONS:
            raise SpemusicError(f"--pe must be one of {', '.join(PE_OPTIONS)} (got {self.pe!r})")
        if self.attention not in ("favor", "softmax"):
            raise SpemusicError(f"--attention must be favor or softmax (got {self.attention!r})")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise SpemusicError(f"--precision must be auto, fp32 or bf16 (got {self.precision!r})")
        for name in ("seq_len", "batch_size", "grad_accum"):
            if getattr(self, name) < 1:
                raise SpemusicError(f"--{name.replace('_', '-')} must be at least 1")
        if self.steps <= 0 and self.epochs <= 0:
            raise SpemusicError("give --steps or --epochs (a positive number)")
        if self.steps > 0 and self.epochs > 0:
            raise SpemusicError(f"give --steps or --epochs, not both (got {self.steps} steps and {self.epochs} epochs)")
        for name in ("lr", "weight_decay", "epochs", "grad_clip"):
            if not math.isfinite(getattr(self, name)):
                raise SpemusicError(f"--{name.replace('_', '-')} must be a finite number (got {getattr(self, name)})")
        if self.lr <= 0:
            raise SpemusicError("--lr must be positive")
        for name in ("warmup", "feature_redraw", "transpose"):
            if getattr(self, name) < 0:
                raise SpemusicError(f"--{name.replace('_', '-')} must be at least 0")
        for name in ("val_every", "save_every", "log_every"):
            if getattr(self, name) < 1:
                raise SpemusicError(f"--{name.replace('_', '-')} must be at least 1")
        if self.weight_decay < 0:
            raise SpemusicError("--weight-decay must be at least 0")
        if not -1 <= self.short_conv <= 64:
            raise SpemusicError(f"--short-conv must be in 0 … 64 (got {self.short_conv})")
        if self.pe in ABSOLUTE_PE_OPTIONS and self.max_len and self.seq_len > self.max_len and not self.init_from:
            raise SpemusicError(f"--seq-len {self.seq_len} is past --max-len {self.max_len}, the positions of an "
                                f"absolute PE ({self.pe}); SPE has no such limit")

    @classmethod
    def from_dict(cls, d: dict, source: str = "") -> "TrainConfig":
        """Options from a TOML file (``source``), the command line or a run's record, type-checked:
        TOML has its own types, and a quoted number or a float step count must not reach training."""
        where = f" in {source}" if source else ""
        types = {f.name: f.type for f in fields(cls)}  # annotations as strings: "int", "float", ...
        unknown = set(d) - set(types)
        if unknown:
            raise SpemusicError(f"unknown training option(s){where}: {', '.join(sorted(unknown))}")
        for name, value in d.items():
            accepted, expected = _OPTION_TYPES[types[name]]
            if not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted):
                raise SpemusicError(f"training option {name}{where} must be {expected}, not {value!r}")
        return cls(**d)


# ----------------------------------------------------------------------------- schedule

def with_short_conv(model: Performer, k: int) -> Performer:
    """The same model with a short convolution of `k` tokens: added at zero, or widened from a
    shorter one with its farther taps at zero. It computes the same function until training moves
    the new weights."""
    from dataclasses import replace

    k0 = model.cfg.short_conv
    if k < k0:
        raise SpemusicError(f"the model has a short convolution of {k0} tokens; --short-conv {k} cannot "
                            f"shorten it (it can only widen it)")
    with torch.random.fork_rng(devices=[]):  # the run draws the same SPE codes as without it
        new = Performer(replace(model.cfg, short_conv=k)).to(model.device)
    state = {n: v for n, v in model.state_dict().items() if not n.endswith(".shift")}
    missing, unexpected = new.load_state_dict(state, strict=False)
    assert not unexpected and all(n.endswith(".shift") for n in missing), (missing, unexpected)
    with torch.no_grad():
        for old_block, new_block in zip(model.blocks, new.blocks):
            if old_block.shift is not None:  # tap j-1 weighs the token j back: the near taps carry over
                new_block.shift[:k0] = old_block.shift
    return new


def lr_lambda(warmup: int, total: int, floor: float = 0.1):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return f


def build_optimizer(model: Performer, lr: float, weight_decay: float, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices (embeddings excepted), none on gains and biases.
    Fused (one kernel over all tensors) on CPUs as on GPUs: on a CPU the default foreach form
    took several times longer per optimizer step."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), fused=device.type in ("cuda", "cpu"))


def lm_loss(model, batch: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, int]:
    """Mean next-token NLL over non-PAD targets, and their count."""
    logits = model(batch[:, :-1])
    targets = batch[:, 1:]
    loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=pad_id, reduction="sum")
    count = int((targets != pad_id).sum())
    return loss / max(count, 1), count


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


# ----------------------------------------------------------------------------- training

class Logger:
    """metrics.jsonl (one JSON object per log step) on rank 0."""

    def __init__(self, path: Path | None):
        self.path = path

    def log(self, record: dict) -> None:
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


def _warnings(cfg: TrainConfig, cache, has_valid: bool) -> list[str]:
    """Options that run but are probably not what the user meant."""
    out = []
    if cfg.warmup >= cfg.steps:
        out.append(f"--warmup {cfg.warmup} is not shorter than the run ({cfg.steps} steps): the learning rate "
                   f"never reaches --lr {cfg.lr:g}")
    longest = max(f["length"] for f in cache.files("train"))
    if cfg.seq_len > longest:
        out.append(f"--seq-len {cfg.seq_len} is longer than every training piece (longest {longest:,} tokens): "
                   "windows are partly padding, which tokens/s counts")
    if not has_valid:
        out.append("no valid split in the data: no validation loss and no `best` checkpoint")
    return out


def activation_bytes_per_token(cfg: ModelConfig, checkpoint_activations: bool = False) -> int:
    """A rough upper estimate of the training step's memory per token of a micro-batch: each
    layer keeps ~16 d_model, 3 d_ff and 4 heads x features floats for the backward pass (the small
    preset at 4,096 tokens a step: estimated 0.9 GB, measured ~1.1 GB above the runtime's own)."""
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
        raise SpemusicError(f"a micro-batch of {micro_batch:,} x {seq_len:,} tokens would need ~{need / 2**30:,.1f} GB; "
                            f"{free / 2**30:,.1f} GB are free: lower --batch-size or --seq-len (--grad-accum keeps "
                            "the tokens per step), or add --checkpoint-activations")


def lock_run_folder(run_dir: Path):
    """One writer per run folder: an exclusive flock on RUN/.lock, released when the process ends
    however it ends (two writers would interleave metrics.jsonl and overwrite each other's
    checkpoints). Returns the open lock file, to keep for the run."""
    import os

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
        raise SpemusicError(f"{run_dir}: another spemusic train ({holder}) is writing this run; stop it first, "
                            "or give another -o") from None
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


def train(cfg: TrainConfig, run_dir: Path, resume: bool = False, stop_after: int | None = None,
          console=None, show_progress: bool = True) -> dict:
    """Train (or resume) a model into `run_dir`. Returns a summary dict."""
    from rich.console import Console

    console = console or Console(stderr=True)
    run_dir = Path(run_dir)
    rank, world, local_rank = dist_info()
    is_main = rank == 0

    if resume:
        run_file = run_dir / "run.json"
        if not run_file.is_file():
            raise SpemusicError(f"{run_dir}: nothing to resume (not a training run: no run.json)")
        lock = lock_run_folder(run_dir) if is_main else None  # noqa: F841  (held until train returns)
        if not (run_dir / "last").exists():
            found = checkpoint.relink_last(run_dir) if is_main else None
            if found is None and not checkpoint.complete_checkpoints(run_dir):
                raise SpemusicError(f"{run_dir}: nothing to resume (the run stopped before its first checkpoint); "
                                    "start it again: train … -o with the same folder")
            if found is not None:
                console.print(f"[yellow]note:[/] {run_dir}: `last` was missing; resuming from the newest complete "
                              f"checkpoint, {found.relative_to(run_dir)}", highlight=False)
        saved_run = read_run_record(run_file)
        saved = TrainConfig.from_dict(saved_run["train"], source=str(run_file))
        cache = saved_run.get("data_cache")
        if cache and not Path(saved.data).exists() and Path(cache).is_dir():
            saved.data = cache  # a run recorded with a relative DATA, resumed elsewhere
        # options given again on resume may only extend the run, not change the model or data
        if cfg.steps and cfg.steps < saved.steps:
            raise SpemusicError(f"--steps {cfg.steps} is below the run's {saved.steps} steps: a resumed run can only "
                                "grow (stop it earlier with --stop-after)")
        saved.steps = cfg.steps or saved.steps
        saved.epochs = 0.0  # a run started with --epochs recorded the steps they came to
        cfg = saved
    cfg.check()
    if not resume:
        cfg.data = str(Path(cfg.data).resolve())  # the run's record must hold from any working folder
        cfg.beats, cfg.chords = (str(Path(p).resolve()) if p else "" for p in (cfg.beats, cfg.chords))
        check_output_folder(run_dir)
        if (run_dir / "last").exists():
            raise SpemusicError(f"{run_dir}: already holds a training run; use --resume {run_dir} or another -o")
        kept = checkpoint.complete_checkpoints(run_dir)
        if kept:  # a run whose links were lost: starting afresh would delete them
            raise SpemusicError(f"{run_dir}: holds {len(kept)} complete checkpoint(s) ({kept[-1].relative_to(run_dir)} "
                                f"the newest); use --resume {run_dir} or another -o")

    device = pick_device(cfg.device)
    if world > 1:
        if device.type == "cuda":
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if cfg.batch_size % world:
            raise SpemusicError(f"--batch-size {cfg.batch_size} must be divisible by the {world} processes")

    # fine-tuning takes the model config, weights and tokenizer of the starting model
    base_model = None
    if resume:  # the run's own record: also right for fine-tuning runs (checked by read_run_record)
        tok_cfg = TokenizerConfig.from_dict(saved_run["tokenizer"])
    elif cfg.init_from:
        base_model, base_tokenizer = checkpoint.load_model(cfg.init_from)
        tok_cfg = base_tokenizer.config
    else:
        tok_cfg = TokenizerConfig(chords=bool(cfg.chords))
    annotations = dict(beats_dir=Path(cfg.beats) if cfg.beats else None, chords_dir=Path(cfg.chords) if cfg.chords else None)
    # data: rank 0 prepares the cache if needed, the others then read it
    if is_main:
        cache = open_dataset(Path(cfg.data), tok_cfg, **annotations)
    _barrier(world)
    if not is_main:
        cache = open_dataset(Path(cfg.data), tok_cfg, **annotations)
    tokenizer = cache.tokenizer
    tok_cfg = tokenizer.config
    planned = (ModelConfig.from_dict(saved_run["model"]) if resume else base_model.cfg if base_model is not None
               else ModelConfig.preset(cfg.preset, vocab_size=len(tokenizer)))
    check_memory(planned, max(cfg.batch_size // world, 1), cfg.seq_len, cfg.checkpoint_activations, device,
                 cfg.valid_windows)
    sampler = WindowSampler(cache, "train", cfg.seq_len, cfg.transpose)
    has_valid = bool(cache.files("valid"))
    valid = fixed_windows(cache, "valid", cfg.seq_len, cfg.valid_windows) if has_valid else None

    tokens_per_step = cfg.batch_size * cfg.grad_accum * cfg.seq_len
    if cfg.steps <= 0:
        train_tokens = cache.index["splits"]["train"]["tokens"]
        cfg.steps = max(1, math.ceil(cfg.epochs * train_tokens / tokens_per_step))

    torch.manual_seed(cfg.seed)
    if resume:
        model_cfg = ModelConfig.from_dict(saved_run["model"])
        model = Performer(model_cfg).to(device)
    elif base_model is not None:
        model, model_cfg = base_model.to(device), base_model.cfg
        if cfg.short_conv >= 0 and cfg.short_conv != model_cfg.short_conv:
            if cfg.short_conv < model_cfg.short_conv:
                raise SpemusicError(f"{cfg.init_from} has a short convolution of {model_cfg.short_conv} tokens; "
                                    f"--short-conv {cfg.short_conv} cannot shorten it (it can only widen it)")
            model = with_short_conv(model, cfg.short_conv)
            model_cfg = model.cfg
        if model_cfg.has_absolute_pe and cfg.seq_len > model_cfg.max_len:
            raise SpemusicError(f"--seq-len {cfg.seq_len} is past {cfg.init_from}'s absolute positions "
                                f"({model_cfg.max_len}); SPE models have no such limit")
        cfg.pe, cfg.gated, cfg.attention, cfg.max_len = model_cfg.pe, model_cfg.gated, model_cfg.attention, model_cfg.max_len
        size = lambda c: (c.n_layers, c.d_model, c.n_heads, c.d_ff)  # noqa: E731
        cfg.preset = next((n for n in PRESETS if size(ModelConfig.preset(n, vocab_size=1)) == size(model_cfg)), "custom")
    else:
        extra = {"short_conv": cfg.short_conv} if cfg.short_conv >= 0 else {}
        model_cfg = ModelConfig.preset(cfg.preset, vocab_size=len(tokenizer), pe=cfg.pe, gated=cfg.gated,
                                       attention=cfg.attention, max_len=cfg.max_len or max(cfg.seq_len, 2048), **extra)
        model = Performer(model_cfg).to(device)
    model.checkpoint_activations = cfg.checkpoint_activations
    micro = cfg.batch_size // world
    dtype, dtype_reason = pick_dtype(cfg.precision, device, model_cfg, micro, cfg.seq_len)
    if world > 1 and dtype_reason.startswith("auto: measured"):  # every process trains in rank 0's choice
        choice = torch.tensor([dtype == torch.bfloat16], dtype=torch.int64)
        dist.broadcast(choice, 0)
        dtype = torch.bfloat16 if int(choice) else torch.float32
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay, device)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.warmup, cfg.steps))
    rng = np.random.default_rng(cfg.seed)
    step, best_valid, tokens_seen, elapsed_before = 0, float("inf"), 0, 0.0

    if resume:
        import safetensors.torch

        last = (run_dir / "last").resolve()
        state = checkpoint.load_trainer_state(last)
        weights = last / checkpoint.WEIGHTS
        try:
            safetensors.torch.load_model(model, str(weights), strict=False, device=str(device))
        except Exception as e:  # noqa: BLE001 - wrong shapes, a truncated or foreign file
            raise SpemusicError(f"{weights}: weights do not fit the run's model ({checkpoint.first_problem(e)})") from None
        try:
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
        except (ValueError, KeyError, TypeError, RuntimeError) as e:
            raise SpemusicError(f"{last / checkpoint.TRAINER}: optimizer state does not fit the run's model "
                                f"({checkpoint.first_problem(e)})") from None
        scheduler.lr_lambdas = [lr_lambda(cfg.warmup, cfg.steps)] * len(optimizer.param_groups)
        rng.bit_generator.state = json.loads(state["sampler_rng"])
        torch.set_rng_state(state["torch_rng"])
        if device.type == "cuda" and "cuda_rng" in state:
            torch.cuda.set_rng_state(state["cuda_rng"], device)
        step, best_valid = int(state["step"]), float(state["best_valid"])
        if step >= cfg.steps:
            raise SpemusicError(f"{run_dir}: already trained for its {cfg.steps} steps; give a larger --steps "
                                "to train further")
        tokens_seen, elapsed_before = int(state["tokens"]), float(state["elapsed"])
        if is_main:  # records written after the checkpoint (by the run that stopped) are redone
            metrics = run_dir / "metrics.jsonl"
            if metrics.is_file():
                lines = [line for line in metrics.read_text(errors="replace").splitlines() if line.strip()]
                kept = [line for line in lines if (_record_step(line) or step + 1) <= step]
                unreadable = sum(_record_step(line) is None for line in lines)
                if unreadable:
                    console.print(f"[yellow]note:[/] {metrics}: dropped {unreadable} unreadable line(s)", highlight=False)
                metrics.write_text("".join(line + "\n" for line in kept))
    elif is_main:
        lock = lock_run_folder(run_dir)  # noqa: F841  (held until train returns)
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
        write_atomically(json.dumps(  # never a half-written record on a full disk
            {"train": asdict(cfg), "model": model_cfg.to_dict(), "tokenizer": tok_cfg.to_dict(),
             "data_cache": str(cache.path), "world_size": world}, indent=2).encode(), run_dir / "run.json")

    train_model = model
    if world > 1:
        train_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile:
        train_model = torch.compile(train_model)

    logger = Logger(run_dir / "metrics.jsonl" if is_main else None)
    n_params = model.num_parameters()
    trained_tokens = trained_vocabulary(cache, cfg.transpose)
    if is_main:
        start = f"fine-tuning {cfg.init_from}" if cfg.init_from else cfg.preset
        which = checkpoint.run_checkpoint_used(cfg.init_from) if cfg.init_from else None
        if which:
            start += f" ({which})"
        if step:
            start = f"resuming {run_dir} at step {step:,} ({start})"
        console.print(f"[bold]spemusic train[/]: {start} ({n_params / 1e6:.2f}M parameters), pe={cfg.pe}"
                      f"{' gated' if cfg.gated and cfg.pe in ('sinespe', 'convspe') else ''}, attention={cfg.attention}, "
                      f"seq-len {cfg.seq_len}, {tokens_per_step} tokens/step, {cfg.steps} steps, "
                      f"{device.type} {str(dtype).replace('torch.', '')} ({dtype_reason}), {world} process(es)")
        console.print(f"data: {cache.path} — train {cache.index['splits']['train']['files']} files / "
                      f"{cache.index['splits']['train']['tokens']:,} tokens, valid {cache.index['splits']['valid']['files']} files")
        for warning in _warnings(cfg, cache, has_valid):
            console.print(f"[yellow]warning:[/] {warning}", highlight=False)
        if compiled.unavailable():
            console.print(f"note: the step's compiled regions run uncompiled: {compiled.unavailable()}", highlight=False)

    def save(names: list[str]) -> None:
        if not all(torch.isfinite(p).all() for p in model.parameters()):  # never saved as best or last
            raise SpemusicError(f"training diverged at step {step} (weights not finite); try a lower --lr")
        info = {"step": step, "tokens": tokens_seen, "train_loss": last_train_loss, "valid_loss": last_valid,
                "best_valid_loss": best_valid if math.isfinite(best_valid) else None,
                "seq_len": cfg.seq_len, "data": str(cfg.data), "preset": cfg.preset,
                "parameters": n_params, "trained_tokens": trained_tokens}
        trainer_state = {
            "format": checkpoint.FORMAT, "step": step, "best_valid": best_valid, "tokens": tokens_seen,
            "elapsed": elapsed_before + (time.perf_counter() - t_start),
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "sampler_rng": json.dumps(rng.bit_generator.state), "torch_rng": torch.get_rng_state(),
        }
        if device.type == "cuda":
            trainer_state["cuda_rng"] = torch.cuda.get_rng_state(device)
        checkpoint.save_run_checkpoint(run_dir, names, step, model, tok_cfg, info, trainer_state)

    last_train_loss, last_valid, last_window = None, None, 0
    window_loss, window_count, window_tokens = 0.0, 0, 0
    t_start = time.perf_counter()
    t_window = t_start
    end_step = cfg.steps if stop_after is None else min(cfg.steps, step + stop_after)
    initial_loss = None

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    progress = Progress(TextColumn("[bold]train"), BarColumn(), TextColumn("step {task.completed}/{task.total}"),
                        TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                        disable=not (is_main and show_progress))
    model.train()
    with progress:
        task = progress.add_task("train", total=cfg.steps, completed=step, loss="-", tps="-")
        while step < end_step:
            if cfg.feature_redraw and step % cfg.feature_redraw == 0 and step > 0:
                # same generator on every rank: features stay identical across processes
                model.redraw_features(torch.Generator().manual_seed(cfg.seed * 1_000_003 + step))
            optimizer.zero_grad(set_to_none=True)
            step_loss = 0.0
            for micro_step in range(cfg.grad_accum):
                batch = sampler.sample(rng, cfg.batch_size, augment=cfg.transpose > 0)
                batch = torch.from_numpy(batch[rank * micro:(rank + 1) * micro]).to(device)
                sync = micro_step == cfg.grad_accum - 1
                ctx = train_model.no_sync() if (world > 1 and not sync) else contextlib.nullcontext()
                with ctx, torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                    loss, _ = lm_loss(train_model, batch, tokenizer.pad_id)
                    (loss / cfg.grad_accum).backward()
                step_loss += loss.item() / cfg.grad_accum
            if not math.isfinite(step_loss):
                raise SpemusicError(f"training diverged at step {step} (loss {step_loss}); try a lower --lr")
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            scheduler.step()
            step += 1
            tokens_seen += tokens_per_step
            if initial_loss is None:
                initial_loss = step_loss
            window_loss += step_loss
            window_count += 1
            window_tokens += tokens_per_step
            progress.update(task, completed=step, loss=f"{step_loss:.3f}")

            do_val = valid is not None and (step % cfg.val_every == 0 or step == cfg.steps)
            do_log = step % cfg.log_every == 0 or do_val or step == end_step
            if do_log:
                if world > 1:
                    t = torch.tensor([window_loss], dtype=torch.float64, device=device)
                    dist.all_reduce(t)
                    window_loss = float(t) / world
                now = time.perf_counter()
                tps = window_tokens / max(now - t_window, 1e-9)
                last_train_loss, last_window = window_loss / window_count, window_count
                record = {"step": step, "train_loss": round(last_train_loss, 5),
                          "lr": float(f"{scheduler.get_last_lr()[0]:.6g}"), "tokens_per_s": round(tps, 1),
                          "tokens": tokens_seen}
                if do_val:
                    last_valid = evaluate_windows(model, valid, tokenizer.pad_id, device, dtype)
                    record["valid_loss"] = round(last_valid, 5)
                logger.log(record)
                progress.update(task, tps=f"{tps:,.0f}")
                window_loss, window_count, window_tokens = 0.0, 0, 0
                t_window = time.perf_counter()
            if is_main:
                names = []
                if do_val and last_valid is not None and last_valid < best_valid:
                    best_valid = last_valid
                    names.append("best")
                if step % cfg.save_every == 0 or step == end_step:
                    names.append("last")
                if names:
                    save(names)
            _barrier(world)

    wall = time.perf_counter() - t_start
    summary = {"steps": step, "total_steps": cfg.steps, "tokens": tokens_seen, "initial_loss": initial_loss,
               "train_loss": last_train_loss, "valid_loss": last_valid,
               "best_valid_loss": best_valid if math.isfinite(best_valid) else None,
               "wall_seconds": wall, "run_dir": str(run_dir)}
    if is_main and last_train_loss is not None:
        stopped = step < cfg.steps
        console.print(("stopped (--stop-after)" if stopped else "done") + f": step {step}/{cfg.steps}, train loss "
                      f"{last_train_loss:.4f} (mean of the last {last_window} steps)"
                      + (f", valid loss {last_valid:.4f} (best {best_valid:.4f})" if last_valid is not None else "")
                      + f", {wall:.0f} s; checkpoints in {run_dir}/last" + (" and best" if math.isfinite(best_valid) else "")
                      + (f"; continue with: spemusic train --resume {run_dir}" if stopped else ""))
    if world > 1:
        dist.destroy_process_group()
    return summary
