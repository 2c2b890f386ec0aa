"""Per-token NLL by position on the chunked parallel path: how a model's loss behaves up to and
beyond the length it was trained on (the length-extrapolation study of the SPE paper)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import OptionError, SpemusicError
from ..generation.cache import CacheOptions, mixture_nll
from ..nn.model import Performer
from ..tokens.tokenizer import DURATION, PITCH, PROGRAM, VELOCITY, REMITokenizer
from .data import open_dataset


@dataclass
class NLLReport:
    model: str
    mean_nll: float                  # over every scored token
    trained_len: int | None
    buckets: list[dict]              # {start, end, nll, tokens}
    pieces: int
    notes: int = 0                   # notes (Pitch tokens) and bars (Bar tokens) among the targets:
    bars: int = 0                    # nats per note / per bar compare across tokenizations
    total_nll: float = 0.0
    # by part (a note's Program, Pitch, Velocity and Duration tokens belong to its Program: melody,
    # bridge, piano, a GM program, drums): {part: {"notes", "nll" (summed)}}; "shared" holds the rest
    # (Bar, Position, Chord, Tempo, TimeSig, EOS), per note of the piece
    parts: dict = field(default_factory=dict)

    @property
    def nats_per_note(self) -> float | None:
        return self.total_nll / self.notes if self.notes else None

    @property
    def nats_per_bar(self) -> float | None:
        return self.total_nll / self.bars if self.bars else None

    def part_nats_per_note(self) -> dict[str, float]:
        """Nats per note of each part's own tokens, and of the shared tokens per note of the piece."""
        return {name: p["nll"] / (p["notes"] or self.notes) for name, p in self.parts.items()}

    def to_dict(self) -> dict:
        return {"model": self.model, "mean_nll": self.mean_nll, "nats_per_note": self.nats_per_note,
                "nats_per_bar": self.nats_per_bar, "notes": self.notes, "bars": self.bars,
                "parts": {n: {**p, "nats_per_note": self.part_nats_per_note()[n]} for n, p in self.parts.items()},
                "trained_len": self.trained_len, "pieces": self.pieces, "buckets": self.buckets}

    def mean_between(self, start: int, end: int) -> float:
        rows = [b for b in self.buckets if b["start"] >= start and b["end"] <= end and b["tokens"]]
        total = sum(b["tokens"] for b in rows)
        return sum(b["nll"] * b["tokens"] for b in rows) / total if total else float("nan")


@torch.no_grad()
def position_nll(model: Performer, sequences: list[np.ndarray], pad_id: int, max_len: int,
                 batch_size: int = 4, seed: int = 0, device="cpu", progress=None,
                 cache: tuple[CacheOptions, torch.Tensor] | None = None,
                 per_piece: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sum of NLL and count of scored tokens at every target position 1..max_len (index 0 is the
    first predicted token), over sequences taken from the start of each piece. `cache` (options,
    their token groups): the NLL of the model mixed with a continuous cache (spemusic.generation.cache).
    `per_piece`: a list that gets (the piece's target ids, their NLL) for every piece."""
    model.eval()
    model.resample(seed)
    nll_sum = np.zeros(max_len, dtype=np.float64)
    count = np.zeros(max_len, dtype=np.int64)
    pieces = [np.asarray(s[: max_len + 1], dtype=np.int64) for s in sequences if len(s) > 1]
    pieces.sort(key=len, reverse=True)  # similar lengths together: little padding
    task = progress.add_task("scoring", total=len(pieces)) if progress is not None else None
    for i in range(0, len(pieces), batch_size):
        group = pieces[i: i + batch_size]
        width = max(len(p) for p in group)
        batch = np.full((len(group), width), pad_id, dtype=np.int64)
        for j, p in enumerate(group):
            batch[j, : len(p)] = p
        x = torch.from_numpy(batch).to(device)
        targets = x[:, 1:]
        if cache is None:
            logits = model(x[:, :-1]).float()
            nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none", ignore_index=pad_id)
        else:
            logits, hidden = model.logits_and_hidden(x[:, :-1])
            nll = torch.zeros(targets.shape, device=x.device)
            for j, p in enumerate(group):
                n = len(p) - 1
                nll[j, :n] = mixture_nll(logits[j, :n], hidden[j, :n], targets[j, :n], *cache)
        mask = (targets != pad_id).cpu().numpy()
        nll_np = nll.cpu().numpy()
        nll_sum[: width - 1] += (nll_np * mask).sum(0)
        if per_piece is not None:
            per_piece += [(p[1:], nll_np[j, : len(p) - 1]) for j, p in enumerate(group)]
        count[: width - 1] += mask.sum(0)
        if task is not None:
            progress.advance(task, len(group))
    return nll_sum, count


def evaluate_nll(model: Performer, tokenizer: REMITokenizer, data: Path, split: str = "valid", max_len: int = 2048,
                 bucket: int = 128, name: str = "model", trained_len: int | None = None, device="cpu",
                 max_pieces: int | None = None, progress=None, beats_dir: Path | None = None,
                 chords_dir: Path | None = None, cache: CacheOptions | None = None) -> NLLReport:
    """NLL by position of `model` on a split of `data`; with `cache`, of the model mixed with a
    continuous cache of each piece's own hidden states (spemusic.generation.cache)."""
    if max_len < 1 or bucket < 1:
        raise OptionError("{max_len} and {bucket} must be positive")
    if model.cfg.length_limited and max_len > model.cfg.max_len:
        raise OptionError("{name}: absolute positional encoding limited to {limit} tokens; use {max_len} {limit} or less",
                          name=name, limit=model.cfg.max_len)
    dataset = open_dataset(Path(data), tokenizer.config, beats_dir=beats_dir, chords_dir=chords_dir)
    if dataset.index["fingerprint"] != tokenizer.config.fingerprint():
        raise SpemusicError(f"{data}: data cache made with another tokenizer than {name}'s")
    sequences = dataset.sequences(split)
    if not sequences:
        raise OptionError("{data}: the {value} split is empty (use {split} all for a plain folder)", data=str(data),
                          value=split)
    if max_pieces:
        sequences = sequences[:max_pieces]
    # no position past the longest piece has a token: the table stops at its bucket, and a huge
    # --max-len costs nothing (it once asked for gigabytes of position arrays)
    longest = max(len(s) for s in sequences) - 1
    max_len = max(1, min(max_len, -(-longest // bucket) * bucket))
    per_piece = []
    nll_sum, count = position_nll(model, sequences, tokenizer.pad_id, max_len, device=device, progress=progress,
                                  cache=None if cache is None else (cache, cache.groups(tokenizer).to(device)),
                                  per_piece=per_piece)
    buckets = []
    for start in range(0, max_len, bucket):
        end = min(start + bucket, max_len)
        n = int(count[start:end].sum())
        buckets.append({"start": start, "end": end, "nll": float(nll_sum[start:end].sum() / n) if n else None,
                        "tokens": n})
    total = int(count.sum())
    # the targets are tokens 1..max_len of every piece
    lo, hi = tokenizer.range("Pitch")
    targets = [np.asarray(s[1: max_len + 1]) for s in sequences]
    notes = sum(int(np.count_nonzero((t >= lo) & (t < hi))) for t in targets)
    bars = sum(int(np.count_nonzero(t == tokenizer.bar_id)) for t in targets)
    return NLLReport(name, float(nll_sum.sum() / total), trained_len, buckets, len(sequences), notes, bars,
                     float(nll_sum.sum()), part_nll(tokenizer, per_piece))


def part_nll(tokenizer: REMITokenizer, pieces: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    """{part: {"notes", "nll"}} over (target ids, their NLL) pairs: each note token counts for the
    part its Program names, every other token for "shared"."""
    kinds = tokenizer.kinds
    out: dict = {}
    for ids, nll in pieces:
        ids = np.asarray(ids, dtype=np.int64)
        kind = kinds[ids]
        is_program = kind == PROGRAM
        # the Program each token follows (its note's), -1 before any
        last = np.maximum.accumulate(np.where(is_program, np.arange(len(ids)), -1))
        in_note = np.isin(kind, (PROGRAM, PITCH, VELOCITY, DURATION)) & (last >= 0)
        program = np.where(in_note, ids[np.maximum(last, 0)], -1)
        for code in np.unique(program):
            sel = program == code
            name = "shared" if code < 0 else tokenizer.vocab[int(code)].removeprefix("Program_")
            row = out.setdefault(name, {"notes": 0, "nll": 0.0})
            row["notes"] += int(np.count_nonzero(sel & (kind == PITCH)))
            row["nll"] += float(nll[sel].sum())
    order = [n for n in out if n != "shared"] + ["shared"] * ("shared" in out)
    return {n: out[n] for n in order}


PLOT_FORMATS = ("png", "svg", "pdf")


def plot_format(path) -> str:
    """The image format a --plot path asks for, by its suffix."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in PLOT_FORMATS:
        raise OptionError("{plot} {path}: give a .png, .svg or .pdf file", path=str(path))
    return fmt


def plot_reports(reports: list[NLLReport], path: Path) -> None:
    """NLL against position, one curve per model, the trained lengths marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise OptionError("{plot} needs matplotlib: pip install 'spemusic[plot]'") from None
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in reports:
        xs = [(b["start"] + b["end"]) / 2 for b in r.buckets if b["nll"] is not None]
        ys = [b["nll"] for b in r.buckets if b["nll"] is not None]
        line, = ax.plot(xs, ys, marker=".", label=r.model)
        if r.trained_len:
            ax.axvline(r.trained_len, color=line.get_color(), linestyle=":", linewidth=1)
    ax.set_xlabel("token position")
    ax.set_ylabel("NLL per token (nats)")
    ax.set_title("loss by position (dotted: trained length)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    import io

    from ..files import write_atomically

    buf = io.BytesIO()
    fig.savefig(buf, format=plot_format(path), dpi=120)
    plt.close(fig)
    write_atomically(buf.getvalue(), Path(path))
