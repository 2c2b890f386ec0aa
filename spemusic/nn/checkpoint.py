"""Checkpoints: self-contained, safe to load, written atomically.

A checkpoint is a folder:
    model.safetensors  weights (FAVOR+ features included) + metadata: model config, tokenizer
                       config, training info, as JSON strings. Loading it runs no code.
    trainer.pt         (training runs only) optimizer, scheduler, step, sampler and RNG states,
                       loaded with torch.load(weights_only=True), which refuses pickled code.
In a run folder, `last` and `best` are symbolic links to complete `ckpt/step-N` folders; a save
writes a new folder under a temporary name, renames it, then swaps the link with os.replace, so
a kill at any moment leaves the previous checkpoint intact.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np
import safetensors
import safetensors.torch
import torch

from ..errors import SpemusicError
from ..memory import available_memory
from ..options import recorded_sampling
from ..tokens.tokenizer import REMITokenizer, TokenizerConfig
from .device import require_available
from .model import ModelConfig, Performer

FORMAT = "spemusic"
FORMAT_VERSION = "1"
WEIGHTS = "model.safetensors"
TRAINER = "trainer.pt"
# what resuming reads from a trainer state
TRAINER_KEYS = ("optimizer", "scheduler", "sampler_rng", "torch_rng", "step", "best_valid", "tokens", "elapsed")


def shipped_checkpoint_dirs() -> list[Path]:
    """Where named models are looked up: $SPEMUSIC_CHECKPOINTS, the repo checkout's checkpoints/,
    and the copy installed with the package (share/spemusic/checkpoints)."""
    import sys

    dirs = []
    if os.environ.get("SPEMUSIC_CHECKPOINTS"):
        dirs.append(Path(os.environ["SPEMUSIC_CHECKPOINTS"]))
    dirs.append(Path(__file__).resolve().parents[2] / "checkpoints")  # spemusic/nn/checkpoint.py
    dirs.append(Path(sys.prefix) / "share" / "spemusic" / "checkpoints")
    return [d for d in dirs if d.is_dir()]


def available_models() -> dict[str, Path]:
    """Model name -> the folder holding its weights: checkpoint folders, and run folders (their
    `best`, else `last`) directly inside the checkpoint directories."""
    found: dict[str, Path] = {}
    for root in shipped_checkpoint_dirs():
        for d in sorted(root.iterdir()):
            weights = _weights_in(d)
            if weights is not None and d.name not in found:
                found[d.name] = weights.parent
    return found


def checkpoints_env_problem() -> str | None:
    """What keeps $SPEMUSIC_CHECKPOINTS from adding models (missing, a file, a checkpoint itself, a
    folder without any), or None when it is unset or holds some: said, not silently ignored."""
    value = os.environ.get("SPEMUSIC_CHECKPOINTS")
    if not value:
        return None
    folder = Path(value)
    try:
        if not folder.exists():
            return "no such folder"
        if not folder.is_dir():
            return "not a folder"
        if (folder / WEIGHTS).is_file():
            return "is a checkpoint itself; point it at the folder that holds checkpoint folders"
        if any(d.is_dir() and _weights_in(d) is not None for d in folder.iterdir()):
            return None
        return "holds no spemusic model (a folder with model.safetensors, or a run folder)"
    except OSError as e:
        return f"cannot be read ({e.strerror})"


def _weights_in(folder: Path) -> Path | None:
    """The weights of a checkpoint folder, or of a run folder (its `best`, else `last`)."""
    return next((c for c in (folder / WEIGHTS, folder / "best" / WEIGHTS, folder / "last" / WEIGHTS)
                 if c.is_file()), None)


def resolve(name_or_path: str | Path) -> Path:
    """A shipped model name, a checkpoint folder, a run folder (its `best`, else `last`), or a
    .safetensors file -> the weights file. A shipped model's bare name is that model, whatever the
    current folder holds (an output folder named `groove` must not hide it): `./groove` is the folder."""
    models = available_models()
    text = str(name_or_path)
    if text in models and "/" not in text and os.sep not in text:
        return models[text] / WEIGHTS
    p = Path(name_or_path)
    if p.is_file():
        return p
    if p.is_dir():
        weights = _weights_in(p)
        if weights is None:
            raise SpemusicError(f"{p}: not a spemusic checkpoint (no {WEIGHTS})")
        return weights
    known = ", ".join(models) or "none installed"
    raise SpemusicError(f"unknown model {str(name_or_path)!r}: not a file or folder, and not a shipped model ({known})")


def run_checkpoint_used(name_or_path: str | Path) -> str | None:
    """When a model name or path stands for a training run (a folder of runs), which of its
    checkpoints is used, e.g. "runs/pop/best, the run's best checkpoint"; None otherwise."""
    folder = resolve(name_or_path).parent
    if folder.name in ("best", "last") and (folder.parent / "run.json").is_file():
        return f"{folder}, the run's {folder.name} checkpoint"
    return None


def read_metadata(weights: Path) -> dict:
    """The metadata of a checkpoint's weights file as dicts (model_config, tokenizer_config, info),
    not yet validated: see `validated_configs`."""
    try:
        with safetensors.safe_open(str(weights), framework="pt") as f:
            meta = f.metadata() or {}
    except OSError as e:  # permissions, a folder, an I/O error: the file is not read, not "wrong"
        raise SpemusicError(f"{weights}: cannot be read ({e.strerror or e})") from None
    except Exception as e:  # noqa: BLE001 - anything else unreadable is "not a checkpoint"
        raise SpemusicError(f"{weights}: not a spemusic checkpoint ({first_problem(e)[:120]})") from None
    if meta.get("format") != FORMAT:
        raise SpemusicError(f"{weights}: not a spemusic checkpoint (safetensors file without spemusic metadata)")
    if meta.get("version") != FORMAT_VERSION:
        raise SpemusicError(f"{weights}: spemusic checkpoint format {meta.get('version')} is not supported")
    try:
        parsed = {k: json.loads(meta[k]) for k in ("model_config", "tokenizer_config", "info")}
    except KeyError as e:
        raise SpemusicError(f"{weights}: broken spemusic checkpoint metadata (no {e.args[0]})") from None
    except json.JSONDecodeError as e:
        raise SpemusicError(f"{weights}: broken spemusic checkpoint metadata ({e})") from None
    for k, v in parsed.items():
        if not isinstance(v, dict):
            raise SpemusicError(f"{weights}: broken spemusic checkpoint metadata ({k} is not a mapping)")
    return parsed


def validated_configs(weights: Path, meta: dict) -> tuple[ModelConfig, REMITokenizer]:
    """The model config and tokenizer a checkpoint asks for, every field's type and range checked
    and the model's size weighed against the free memory, before anything is allocated: the
    metadata of a checkpoint from elsewhere is not trusted. Errors name the file and the field."""
    try:
        model_cfg = ModelConfig.from_dict(meta["model_config"])
        tok_cfg = TokenizerConfig.from_dict(meta["tokenizer_config"])
    except (SpemusicError, TypeError) as e:  # TypeError: a field the dataclass does not know how to take
        raise SpemusicError(f"{weights}: {e}") from None
    need = 4 * model_cfg.size_estimate()  # fp32
    free = available_memory("cpu")
    if free is not None and need > free:
        raise SpemusicError(f"{weights}: its model config asks for ~{model_cfg.size_estimate() / 1e6:,.0f}M parameters "
                            f"(~{need / 2**30:,.1f} GB); {free / 2**30:,.1f} GB are free")
    tokenizer = REMITokenizer(tok_cfg)
    if model_cfg.vocab_size != len(tokenizer):
        raise SpemusicError(f"{weights}: model vocabulary ({model_cfg.vocab_size}) does not match its tokenizer "
                            f"({len(tokenizer)})")
    return model_cfg, tokenizer


HARMONY_FILE = "harmony.json"  # a model's harmonizer, beside its weights (spemusic.music.harmony)


def load_model(name_or_path: str | Path = "pop-piano", device: str | torch.device = "cpu",
               return_info: bool = False):
    """Load a model and its tokenizer (eval mode, fp32) from a shipped name, a checkpoint folder or
    .safetensors file, or a run folder (its `best` checkpoint, else `last`)."""
    require_available(device)
    weights = resolve(name_or_path)
    meta = read_metadata(weights)
    model_cfg, tokenizer = validated_configs(weights, meta)
    model = Performer(model_cfg)
    try:
        missing, unexpected = safetensors.torch.load_model(model, str(weights), strict=False)
    except Exception as e:  # noqa: BLE001
        raise SpemusicError(f"{weights}: weights do not fit the model config ({first_problem(e)})") from None
    if unexpected or any(not _is_tied(model, k) for k in missing):
        raise SpemusicError(f"{weights}: weights do not fit the model config (missing {sorted(missing)[:3]}, "
                            f"unexpected {sorted(unexpected)[:3]})")
    bad = next((k for k, v in model.state_dict().items() if v.is_floating_point() and not torch.isfinite(v).all()), None)
    if bad is not None:
        raise SpemusicError(f"{weights}: weights are not finite (NaN or infinity in {bad}): the run that saved them diverged")
    model.float().to(device).eval()
    model.trained_tokens = _trained_tokens(weights, meta["info"], len(tokenizer))
    model.release_name = meta["info"].get("name")  # its sampling defaults (SamplingOptions.for_model)
    model.sampling_defaults = recorded_sampling(meta["info"].get("sampling"), str(weights))
    harmony = weights.parent / HARMONY_FILE
    model.harmony_file = harmony if tokenizer.config.chords and harmony.is_file() else None
    if return_info:
        return model, tokenizer, meta["info"]
    return model, tokenizer


def _trained_tokens(weights: Path, info: dict, vocab_size: int):
    """The vocabulary the model saw in training as a (V,) bool mask, or None (checkpoints from
    before it was recorded): the sampler keeps to it."""
    ids = info.get("trained_tokens")
    if ids is None:
        return None
    if not isinstance(ids, list) or not all(isinstance(i, int) and 0 <= i < vocab_size for i in ids) or not ids:
        raise SpemusicError(f"{weights}: broken spemusic checkpoint metadata (trained_tokens is not a list of token ids)")
    mask = np.zeros(vocab_size, dtype=bool)
    mask[ids] = True
    return mask


def first_problem(e: Exception) -> str:
    """The first concrete line of an error: for load_state_dict, "size mismatch for tok.weight: …", not
    its header ("Error(s) in loading state_dict for Performer:"); the error's type when it says nothing."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        lines = lines[1:]
    return lines[0][:200] if lines else type(e).__name__


def _is_tied(model: torch.nn.Module, key: str) -> bool:
    """safetensors stores a shared (tied) tensor once; the other name is then 'missing'."""
    params = dict(model.state_dict(keep_vars=True))
    target = params.get(key)
    return target is not None and any(v is target or (v.data_ptr() == target.data_ptr()) for k, v in params.items() if k != key)


def write_weights(path: Path, model: Performer, tokenizer_config: TokenizerConfig, info: dict,
                  dtype: torch.dtype | None = None) -> None:
    """Weights + metadata into one safetensors file (optionally cast, e.g. to fp16 for shipping)."""
    to_save = model
    if dtype is not None:
        to_save = copy.deepcopy(model).to(dtype)
    metadata = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "model_config": json.dumps(model.cfg.to_dict()),
        "tokenizer_config": json.dumps(tokenizer_config.to_dict()),
        "info": json.dumps(info),
    }
    safetensors.torch.save_model(to_save, str(path), metadata=metadata)
    os.chmod(path, 0o644)  # readable by other users (e.g. the non-root user of the Docker image)


def save_run_checkpoint(run_dir: Path, names: list[str], step: int, model: Performer,
                        tokenizer_config: TokenizerConfig, info: dict, trainer_state: dict) -> Path:
    """Write ckpt/step-N atomically and point each of `names` ('last', 'best') at it."""
    run_dir = Path(run_dir)
    ckpt_root = run_dir / "ckpt"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step-{step:08d}"
    tmp = ckpt_root / f".tmp-step-{step:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        write_weights(tmp / WEIGHTS, model, tokenizer_config, info)
        torch.save(trainer_state, tmp / TRAINER)
        for f in tmp.iterdir():  # data on disk before the rename makes it visible
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    except Exception as e:  # noqa: BLE001 - torch and safetensors report a full disk in their own words
        shutil.rmtree(tmp, ignore_errors=True)
        kept = (f"`last` still points at {(run_dir / 'last').resolve().name}" if (run_dir / "last").exists()
                else "no checkpoint was kept")
        if _disk_full(e, ckpt_root, model):
            raise SpemusicError(f"{ckpt_root}: no space left on device while saving step {step} (a checkpoint needs "
                                f"~{_checkpoint_bytes(model) / 2**20:,.0f} MB); {kept}") from None
        raise SpemusicError(f"{ckpt_root}: cannot save step {step} ({first_problem(e)}); {kept}") from None
    if final.exists():
        # same step saved again (e.g. best after last): keep the complete folder that is there
        shutil.rmtree(tmp)
    else:
        os.rename(tmp, final)
    for name in names:
        link_tmp = run_dir / f".{name}.tmp-{os.getpid()}"
        link_tmp.unlink(missing_ok=True)
        os.symlink(Path("ckpt") / final.name, link_tmp)
        os.replace(link_tmp, run_dir / name)
    _remove_unreferenced(run_dir)
    return final


def _checkpoint_bytes(model: torch.nn.Module) -> int:
    """About what one run checkpoint takes: the weights and AdamW's two moments."""
    return 3 * sum(p.numel() * p.element_size() for p in model.parameters())


def _disk_full(e: Exception, folder: Path, model: torch.nn.Module) -> bool:
    """Whether a failed save ran out of space: ENOSPC where the error carries it, else (torch's
    "unexpected pos", safetensors' wrapped I/O error) less room left than a checkpoint needs."""
    if isinstance(e, OSError) and e.errno == errno.ENOSPC or "No space left" in str(e):
        return True
    try:
        return shutil.disk_usage(folder).free < _checkpoint_bytes(model)
    except OSError:
        return False


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The complete ckpt/step-N folders of a run (weights and trainer state), oldest first."""
    root = Path(run_dir) / "ckpt"
    if not root.is_dir():
        return []
    return sorted(d for d in root.iterdir() if d.name.startswith("step-") and (d / WEIGHTS).is_file()
                  and (d / TRAINER).is_file())


def relink_last(run_dir: Path) -> Path | None:
    """Point a missing or dangling `last` at the newest complete checkpoint (links are lost when
    a run folder is copied without them); returns it, or None when there is none."""
    found = complete_checkpoints(run_dir)
    if not found:
        return None
    link = Path(run_dir) / "last"
    if link.is_symlink():
        link.unlink()
    os.symlink(Path("ckpt") / found[-1].name, link)
    return found[-1]


def _remove_unreferenced(run_dir: Path) -> None:
    keep = {(run_dir / n).resolve() for n in ("last", "best") if (run_dir / n).exists()}
    for d in (run_dir / "ckpt").iterdir():
        if d.name.startswith("step-") and d.resolve() not in keep:
            shutil.rmtree(d, ignore_errors=True)
        elif d.name.startswith(".tmp-") and not d.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(d, ignore_errors=True)  # left by a killed run


def load_trainer_state(ckpt_dir: Path) -> dict:
    path = Path(ckpt_dir) / TRAINER
    if not path.is_file():
        raise SpemusicError(f"{ckpt_dir}: no {TRAINER}: this checkpoint cannot resume training")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickles with code are refused by weights_only
        reason = "empty file" if path.stat().st_size == 0 else first_problem(e)[:120]
        raise SpemusicError(f"{path}: refused: not a spemusic trainer state ({reason})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise SpemusicError(f"{path}: not a spemusic trainer state")
    missing = [k for k in TRAINER_KEYS if k not in state]
    if missing:
        raise SpemusicError(f"{path}: broken trainer state (no {', '.join(missing)})")
    return state
