"""Device and precision picking: which device a command runs on, and the autocast dtype that
trains a model fastest there. Every command checks a device here."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import OptionError

if TYPE_CHECKING:
    from .model import ModelConfig


def pick_device(name: str, auto: bool = True) -> torch.device:
    """The device `name` names: cpu, cuda or cuda:N, or (where `auto`) auto: a GPU when there is one."""
    if auto and name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name != "cpu" and not name.startswith("cuda"):
        choices = "auto, cpu or cuda" if auto else "cpu or cuda"
        raise OptionError("{device} must be " + choices + " (got {name!r})", name=name)
    if name.startswith("cuda"):
        require_available("cuda")
    return torch.device(name)


def require_available(device: str | torch.device) -> None:
    """Refuse a CUDA device on a machine without one (torch would fail later, deep inside)."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise OptionError("{device} cuda: no CUDA GPU is available")


def cpu_has_fast_bf16() -> bool:
    """AMX tiles or AVX512-BF16 instructions make bf16 autocast pay off on a CPU (measured by
    benchmarks/train_throughput.py)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def pick_dtype(precision: str, device: torch.device, model_cfg: ModelConfig | None = None,
               batch: int = 1, seq_len: int = 1) -> tuple[torch.dtype, str]:
    """(autocast dtype, why). `auto`: bf16 on GPUs that have it; on a CPU with bf16 instructions,
    whichever of fp32 and bf16 trains this model config faster, measured (bf16 is not always
    faster there: without AMX it can lose at long sequences, benchmarks/train_throughput.py);
    else fp32."""
    if precision == "fp32":
        return torch.float32, "asked"
    if precision == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise OptionError("{precision} bf16: this GPU does not support bfloat16")
        if device.type == "cpu" and not cpu_has_fast_bf16():  # (AVX2 only: bf16 products ran 60x slower than fp32)
            return torch.bfloat16, "asked; this CPU has no bf16 instructions, so it is emulated, far slower than fp32"
        return torch.bfloat16, "asked"
    if device.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return (torch.bfloat16, "auto: GPU") if ok else (torch.float32, "auto: this GPU has no bf16")
    if not cpu_has_fast_bf16() or model_cfg is None:
        return torch.float32, "auto: no bf16 instructions"
    speed = measure_precisions(model_cfg, batch, seq_len, device)
    dtype = torch.bfloat16 if speed["bf16"] > speed["fp32"] else torch.float32
    return dtype, f"auto: measured fp32 {speed['fp32']:,.0f} vs bf16 {speed['bf16']:,.0f} tokens/s"


def measure_precisions(model_cfg: ModelConfig, batch: int, seq_len: int, device: torch.device,
                       steps: int = 2) -> dict[str, float]:
    """Forward+backward tokens/s of a fresh model of this config in fp32 and bf16 autocast, on
    random tokens (a warm-up pass, then `steps` timed). The global RNG is left as it was, so a run
    draws the same SPE codes whether or not it measured."""
    from .model import Performer

    rng = torch.get_rng_state()
    model = Performer(model_cfg).to(device).train()
    ids = torch.randint(0, model_cfg.vocab_size, (batch, seq_len), device=device)
    speed = {}
    try:
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            for i in range(steps + 1):
                if i == 1:
                    t0 = time.perf_counter()
                with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                    model(ids).float().logsumexp(-1).mean().backward()
            speed[name] = batch * seq_len * steps / (time.perf_counter() - t0)
    finally:
        torch.set_rng_state(rng)
    return speed
