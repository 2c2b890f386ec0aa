"""What the machine has free: checked before a request allocates (a training step, a model a
checkpoint describes), so that an impossible one is refused with the estimate, not killed."""

from __future__ import annotations


def available_memory(device="cpu") -> int | None:
    """Bytes free on `device` (None: unknown). Torch is imported only for a GPU: render asks too."""
    if str(device).startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
