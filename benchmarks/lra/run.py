"""Long Range Arena at CPU scale: does SPE help linear attention beyond music?

    python benchmarks/lra/run.py --task listops          # 7 models x 3 seeds
    python benchmarks/lra/run.py --task pathfinder
    python benchmarks/lra/run.py --task listops --models favor favor-sinespe --seeds 1 --steps 50   # a quick look

Trains the models of benchmarks/lra/models.py (same size, same steps, same data; they differ only
in attention and positional encoding) on data generated in code (listops.py, pathfinder.py; cached
in ~/.cache/spemusic/lra), and prints test accuracy, mean ± std over the seeds, beside the
figures published for the same model families. The setup differences are printed with them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import listops
import pathfinder
import shapes
from models import MODELS, Classifier, loss_and_hits

from spemusic.errors import SpemusicError

from _errors import run_script

TASKS = {"listops": listops, "shapes": shapes, "pathfinder": pathfinder}
IMAGES = ("shapes", "pathfinder")
VOCAB = {"listops": len(listops.VOCAB), "shapes": shapes.VOCAB_SIZE, "pathfinder": pathfinder.VOCAB_SIZE}
CPU_LENGTHS = (100, 500)  # ListOps at CPU scale (docs/lra.md says why)
POOL = {"listops": "cls", "shapes": "cls", "pathfinder": "mean"}  # as the LRA configs (ListOps, Image, Pathfinder) pool
PAD_TO = 256
CACHE = Path.home() / ".cache" / "spemusic" / "lra"

# Published accuracies (%) of the same families. LRA: Tay et al. 2021, Table 1 (its leaderboard);
# SPE: the runs of the SPE paper's code (github aliutkus/spe, experiments/lra/models/gpu_16g,
# results.json, mean of its seeds), made before LRA's ListOps bracket fix and so on bracket-less
# inputs, with 6-layer (ListOps) models of d_model 512 and 256 FAVOR+ features.
PUBLISHED = {
    "shapes": {"softmax": ("LRA Transformer, Image", 42.44), "favor-ape": ("LRA Performer, Image", 42.77),
               "favor-sinespe-gated": ("SPE code, Performer + sineSPE, CIFAR-10", 41.11),
               "favor-convspe-gated": ("SPE code, Performer + convSPE, CIFAR-10, 1 run", 40.06)},
    "listops": {"softmax": ("LRA Transformer", 36.37), "favor-ape": ("LRA Performer", 18.01),
                "favor-sinespe-gated": ("SPE code, Performer + sineSPE (gated)", 17.43)},
    "pathfinder": {"softmax": ("LRA Transformer", 71.40), "favor-ape": ("LRA Performer", 77.05)},
}


def dataset(task: str, n: int, seed: int, lengths: tuple[int, int] = (listops.MIN_LENGTH, listops.MAX_LENGTH),
            size: int | None = None) -> listops.Examples:
    """n examples of `task` (generated once, then read from the cache); ListOps: `lengths` (min,
    max); the image tasks: the image `size` (None: the task's own). LRA's keep the plain name."""
    if task in IMAGES:
        size = size or TASKS[task].SIZE
        suffix = f"-{size}px" if size != TASKS[task].SIZE else ""
    else:
        suffix = f"-{lengths[0]}-{lengths[1]}" if tuple(lengths) != (listops.MIN_LENGTH, listops.MAX_LENGTH) else ""
    path = CACHE / f"{task}-{n}-{seed}{suffix}.npz"
    if path.is_file():
        with np.load(path, allow_pickle=False) as d:  # each d[key] reads the array anew: read once
            tokens, offsets, labels = d["tokens"], d["offsets"], d["labels"]
        return np.split(tokens, offsets[1:-1]), labels
    t0 = time.perf_counter()
    seqs, labels = TASKS[task].generate(n, seed, size) if task in IMAGES else listops.generate(n, seed, lengths)
    CACHE.mkdir(parents=True, exist_ok=True)
    offsets = np.cumsum([0] + [len(s) for s in seqs])
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, tokens=np.concatenate(seqs), offsets=offsets, labels=labels)
    tmp.replace(path)
    print(f"generated {n:,} {task} examples in {time.perf_counter() - t0:.0f} s ({path})")
    return seqs, labels


def batches(seqs, labels, batch_size: int, rng: np.random.Generator | None, cls: bool = False):
    """Batches of similar lengths (less padding), in random order when rng is given; `cls`: the
    model puts a CLS token before each."""
    lengths = [len(s) for s in seqs]
    order = np.argsort(lengths, kind="stable")
    one_length = min(lengths) == max(lengths)  # images
    groups = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    if rng is not None:
        groups = [groups[i] for i in rng.permutation(len(groups))]
    for g in groups:
        # ListOps' many lengths: few shapes for SPE's compiled kernels, a multiple of PAD_TO with
        # the CLS token
        longest = max(lengths[i] for i in g)
        T = longest if one_length else -(-(longest + cls) // PAD_TO) * PAD_TO - cls
        ids = torch.zeros(len(g), T, dtype=torch.long)
        mask = torch.zeros(len(g), T, dtype=torch.bool)
        for j, i in enumerate(g):
            ids[j, : len(seqs[i])] = torch.from_numpy(seqs[i].astype(np.int64))
            mask[j, : len(seqs[i])] = True
        yield ids, mask, torch.from_numpy(labels[g])


def train_one(task: str, kind: str, seed: int, train, test, args) -> dict:
    torch.manual_seed(seed)
    max_len = -(-args.lengths[1] // PAD_TO) * PAD_TO if task == "listops" else args.size ** 2
    model = Classifier(kind, VOCAB[task], TASKS[task].CLASSES, max_len, POOL[task])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, args.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s / args.steps, 1.0))))
    rng = np.random.default_rng(seed)
    t0, step, losses = time.perf_counter(), 0, []
    model.train()
    while step < args.steps:
        for ids, mask, y in batches(*train, args.batch_size, rng, POOL[task] == "cls"):
            loss, _ = loss_and_hits(model, ids, mask, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            step += 1
            if step >= args.steps:
                break
    model.eval()
    hits = 0
    with torch.no_grad():
        for ids, mask, y in batches(*test, 64, None, POOL[task] == "cls"):
            hits += loss_and_hits(model, ids, mask, y)[1]
    return {"model": kind, "seed": seed, "accuracy": 100 * hits / len(test[1]),
            "train_loss_end": float(np.mean(losses[-20:])), "seconds": time.perf_counter() - t0}


_WORKER: dict = {}


def _worker_init(args, lengths) -> None:
    """A worker process: its threads, and the task's data read from the cache once."""
    torch.set_num_threads(args.threads)
    _WORKER.update(args=args, train=dataset(args.task, args.train_size, 1, lengths, args.size),
                   test=dataset(args.task, args.test_size, 2, lengths, args.size))


def _run(job: tuple[str, int]) -> dict:
    kind, seed = job
    return train_one(_WORKER["args"].task, kind, seed, _WORKER["train"], _WORKER["test"], _WORKER["args"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=tuple(TASKS), default="listops")
    ap.add_argument("--models", nargs="*", choices=MODELS, default=list(MODELS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="[default: shapes 1500, the others 1000]")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--train-size", type=int, default=None, help="[default: shapes 16,000, the others 12,000]")
    ap.add_argument("--test-size", type=int, default=1_000)
    ap.add_argument("--lengths", type=int, nargs=2, metavar=("MIN", "MAX"),
                    default=CPU_LENGTHS, help="ListOps: tree lengths kept, in tokens [default: 100 500; "
                    "LRA's: 500 2000, where no model here leaves chance in 600 steps]")
    ap.add_argument("--size", type=int, default=None,
                    help="image tasks: image side in pixels [default: shapes 16, pathfinder 32]")
    ap.add_argument("--threads", type=int, default=1, help="threads per run [default: 1]")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process [default: 1]")
    ap.add_argument("--out", default=None, help="JSON of every run [default: benchmarks/results/lra_TASK.json]")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.task == "listops" and not 1 <= args.lengths[0] < args.lengths[1]:
        raise SpemusicError(f"--lengths {args.lengths[0]} {args.lengths[1]}: give MIN < MAX, both positive")
    lengths = tuple(args.lengths)  # (ListOps only)
    args.size = args.size or getattr(TASKS[args.task], "SIZE", None)
    if args.task in IMAGES and not (8 <= args.size and pathfinder.SIZE * pathfinder.SUPER % args.size == 0):
        raise SpemusicError(f"--size {args.size}: give an image side of at least 8 that divides "
                            f"{pathfinder.SIZE * pathfinder.SUPER} (8, 16, 32, ...)")
    args.steps = args.steps or (1500 if args.task == "shapes" else 1000)
    args.train_size = args.train_size or (16_000 if args.task == "shapes" else 12_000)
    train = dataset(args.task, args.train_size, 1, lengths, args.size)
    test = dataset(args.task, args.test_size, 2, lengths, args.size)
    majority = 100 * np.bincount(test[1]).max() / len(test[1])
    baselines = f"majority class {majority:.1f}%"
    if args.task == "listops":
        baselines += f", the first token alone {listops.first_token_accuracy(train, test):.1f}%"
    print(f"{args.task}: {args.train_size:,} train / {args.test_size:,} test examples, {args.steps} steps of "
          f"{args.batch_size}, {len(args.models)} models x {args.seeds} seeds; {baselines}")
    jobs = [(kind, seed) for kind in args.models for seed in range(args.seeds)]
    runs = []
    with ProcessPoolExecutor(args.jobs, initializer=_worker_init, initargs=(args, lengths)) as pool:
        for r in pool.map(_run, jobs):  # in the jobs' order, as each is done
            runs.append(r)
            print(f"  {r['model']:<22} seed {r['seed']}: {r['accuracy']:5.1f}%  (train loss {r['train_loss_end']:.3f}, "
                  f"{r['seconds']:.0f} s)", flush=True)
    print(f"\n{'model':<22}{'accuracy %':>16}   published (other setup: see below)")
    for kind in args.models:
        acc = [r["accuracy"] for r in runs if r["model"] == kind]
        pub = PUBLISHED[args.task].get(kind)
        print(f"{kind:<22}{np.mean(acc):>9.1f} ± {np.std(acc, ddof=1) if len(acc) > 1 else 0:<4.1f}   "
              f"{f'{pub[1]:.1f} ({pub[0]})' if pub else ''}")
    print(f"\nhere: {len(MODELS and args.models)} models of 2 layers, d_model 64, 4 heads, 64 FAVOR+ features, SPE "
          f"R = 32 (10 sines; convSPE 128 taps), {args.steps} steps of {args.batch_size}, "
          f"{args.train_size:,} generated examples, lengths up to "
          f"{args.lengths[1] if args.task == 'listops' else args.size ** 2}; "
          "published: LRA's models (ListOps 6 layers, d_model 512; Pathfinder-32 1 layer, d_model 32) "
          "trained 10k+ steps on 96k (ListOps) / 160k (Pathfinder) examples; Image: 32x32 CIFAR-10 photographs "
          "(10 classes, 45k), the SPE code's models 1 layer, d_model 128, 200 epochs")
    out = Path(args.out or f"benchmarks/results/lra_{args.task}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": vars(args), "majority": majority, "runs": runs}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    run_script(main)
