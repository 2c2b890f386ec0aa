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
import json
import os
import shutil
from pathlib import Path

import safetensors
import safetensors.torch
import torch

from .errors import SpemusicError
from .model import ModelConfig, Performer
from .tokenizer import REMITokenizer, TokenizerConfig

FORMAT = "spemusic"
FORMAT_VERSION = "1"
WEIGHTS = "model.safetensors"
TRAINER = "trainer.pt"


def shipped_checkpoint_dirs() -> list[Path]:
    """Where named models are looked up: $SPEMUSIC_CHECKPOINTS, the repo checkout's checkpoints/,
    and the copy installed with the package (share/spemusic/checkpoints)."""
    import sys

    dirs = []
    if os.environ.get("SPEMUSIC_CHECKPOINTS"):
        dirs.append(Path(os.environ["SPEMUSIC_CHECKPOINTS"]))
    dirs.append(Path(__file__).resolve().parent.parent / "checkpoints")
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


def _weights_in(folder: Path) -> Path | None:
    """The weights of a checkpoint folder, or of a run folder (its `best`, else `last`)."""
    return next((c for c in (folder / WEIGHTS, folder / "best" / WEIGHTS, folder / "last" / WEIGHTS)
                 if c.is_file()), None)


def resolve(name_or_path: str | Path) -> Path:
    """A shipped model name, a checkpoint folder, a run folder (its `best`, else `last`), or a
    .safetensors file -> the weights file."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    if p.is_dir():
        weights = _weights_in(p)
        if weights is None:
            raise SpemusicError(f"{p}: not a spemusic checkpoint (no {WEIGHTS})")
        return weights
    models = available_models()
    if str(name_or_path) in models:
        return models[str(name_or_path)] / WEIGHTS
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
    try:
        with safetensors.safe_open(str(weights), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as e:  # noqa: BLE001 - any unreadable file is "not a checkpoint"
        raise SpemusicError(f"{weights}: not a spemusic checkpoint ({str(e).splitlines()[0][:120]})") from None
    if meta.get("format") != FORMAT:
        raise SpemusicError(f"{weights}: not a spemusic checkpoint (safetensors file without spemusic metadata)")
    if meta.get("version") != FORMAT_VERSION:
        raise SpemusicError(f"{weights}: spemusic checkpoint format {meta.get('version')} is not supported")
    try:
        return {k: json.loads(meta[k]) for k in ("model_config", "tokenizer_config", "info")}
    except (KeyError, json.JSONDecodeError) as e:
        raise SpemusicError(f"{weights}: broken spemusic checkpoint metadata ({e})") from None


def load_model(name_or_path: str | Path = "pop-piano", device: str | torch.device = "cpu",
               return_info: bool = False):
    """Load a model and its tokenizer (eval mode, fp32) from a shipped name, a checkpoint folder or
    .safetensors file, or a run folder (its `best` checkpoint, else `last`)."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise SpemusicError("device cuda: no CUDA GPU is available")
    weights = resolve(name_or_path)
    meta = read_metadata(weights)
    model_cfg = ModelConfig.from_dict(meta["model_config"])
    tokenizer = REMITokenizer(TokenizerConfig.from_dict(meta["tokenizer_config"]))
    if model_cfg.vocab_size != len(tokenizer):
        raise SpemusicError(f"{weights}: model vocabulary ({model_cfg.vocab_size}) does not match its tokenizer ({len(tokenizer)})")
    model = Performer(model_cfg)
    try:
        missing, unexpected = safetensors.torch.load_model(model, str(weights), strict=False)
    except Exception as e:  # noqa: BLE001
        raise SpemusicError(f"{weights}: weights do not fit the model config ({str(e).splitlines()[0][:160]})") from None
    if unexpected or any(not _is_tied(model, k) for k in missing):
        raise SpemusicError(f"{weights}: weights do not fit the model config (missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
    bad = next((k for k, v in model.state_dict().items() if v.is_floating_point() and not torch.isfinite(v).all()), None)
    if bad is not None:
        raise SpemusicError(f"{weights}: weights are not finite (NaN or infinity in {bad}): the run that saved them diverged")
    model.float().to(device).eval()
    if return_info:
        return model, tokenizer, meta["info"]
    return model, tokenizer


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
    tmp.mkdir()
    write_weights(tmp / WEIGHTS, model, tokenizer_config, info)
    torch.save(trainer_state, tmp / TRAINER)
    for f in tmp.iterdir():  # data on disk before the rename makes it visible
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
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
        raise SpemusicError(f"{path}: refused: not a spemusic trainer state ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise SpemusicError(f"{path}: not a spemusic trainer state")
    return state
