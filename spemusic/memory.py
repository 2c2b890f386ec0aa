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
        free = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        free = None
    room = _address_space_left()
    return room if free is None else free if room is None else min(free, room)


def _address_space_left() -> int | None:
    """Bytes this process may still map under its address-space limit (ulimit -v; None: no limit)."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return None
    return max(limit - size, 0)
