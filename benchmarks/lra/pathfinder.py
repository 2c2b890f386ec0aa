"""Pathfinder (Linsley et al. 2018) as the Long Range Arena uses it, generated here in numpy.

A 32x32 grey image holds two markers and a few curved, dashed paths ("snakes"); the label says
whether one path joins the two markers. Flattened row by row, an image is a sequence of 1,024
pixel tokens (0-255), and a model must follow a path across hundreds of positions.

Like the original generator (snakes2.py): each snake is a chain of short dashes whose direction
turns a little from one dash to the next; a positive image puts the markers at the two ends of
one snake, a negative one at the ends of two different snakes; distractor dashes fill the rest.
Simpler than it: lines are drawn by supersampling (8x) instead of its paddle masks, and snakes
may touch. CONTOUR_DASHES sets the difficulty (LRA's Pathfinder-32 "hard" has 14).
"""

from __future__ import annotations

import numpy as np

SIZE, SUPER = 32, 8          # LRA's Pathfinder-32; the lengths below are in its pixels
CLASSES = 2
VOCAB_SIZE = 256
CONTOUR_DASHES = 6          # dashes per snake
DASH, GAP = 2.0, 1.0        # dash and gap lengths, in pixels
MAX_TURN = np.pi / 5        # largest turn between two dashes
DISTRACTORS = 6             # loose dashes
MARKER_RADIUS = 1.5


def _segment(canvas: np.ndarray, a: np.ndarray, b: np.ndarray, width: float = 0.5) -> None:
    """Draw the segment a-b (Pathfinder-32 pixel coordinates) into the supersampled canvas."""
    n = int(np.ceil(np.linalg.norm(b - a) * SUPER * 2)) + 1
    pts = (a[None] + (b - a)[None] * np.linspace(0, 1, n)[:, None]) * SUPER
    r = max(1, int(round(width * SUPER / 2)))
    for y, x in pts.astype(int):
        canvas[max(y - r, 0): y + r + 1, max(x - r, 0): x + r + 1] = 1.0


def _disc(canvas: np.ndarray, c: np.ndarray, radius: float) -> None:
    yy, xx = np.mgrid[0: canvas.shape[0], 0: canvas.shape[1]]
    canvas[(yy - c[0] * SUPER) ** 2 + (xx - c[1] * SUPER) ** 2 <= (radius * SUPER) ** 2] = 1.0


def _snake(rng: np.random.Generator, canvas: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Draw one snake that stays inside the image; its two ends, or None when it would leave."""
    margin = 2.0
    p = rng.uniform(margin, SIZE - margin, size=2)
    angle = rng.uniform(0, 2 * np.pi)
    start, dashes = p.copy(), []
    for _ in range(CONTOUR_DASHES):
        d = np.array([np.sin(angle), np.cos(angle)])
        q = p + DASH * d
        if not (margin <= q.min() and q.max() <= SIZE - margin):
            return None
        dashes.append((p, q))
        p = q + GAP * d
        angle += rng.uniform(-MAX_TURN, MAX_TURN)
    for a, b in dashes:
        _segment(canvas, a, b)
    return start, dashes[-1][1]


def image(rng: np.random.Generator, label: int, size: int = SIZE) -> np.ndarray:
    """One (size, size) uint8 image whose markers are joined by a snake iff label == 1: the
    Pathfinder-32 picture, averaged down to `size` pixels a side when smaller."""
    while True:
        canvas = np.zeros((SIZE * SUPER, SIZE * SUPER), dtype=np.float32)
        ends = [_snake(rng, canvas) for _ in range(2)]
        if any(e is None for e in ends):
            continue
        (a0, a1), (b0, b1) = ends
        if np.linalg.norm(a1 - b0) < 4 or np.linalg.norm(a0 - b0) < 4:
            continue  # markers of a negative image must not sit on one spot
        markers = (a0, a1) if label else (a0, b0 if rng.random() < 0.5 else b1)
        for _ in range(DISTRACTORS):
            p = rng.uniform(2, SIZE - 2, size=2)
            ang = rng.uniform(0, 2 * np.pi)
            _segment(canvas, p, np.clip(p + DASH * np.array([np.sin(ang), np.cos(ang)]), 0, SIZE - 1))
        for m in markers:
            _disc(canvas, m, MARKER_RADIUS)
        f = SIZE * SUPER // size
        small = canvas.reshape(size, f, size, f).mean((1, 3))
        return np.round(small * 255).astype(np.uint8)


def generate(n: int, seed: int, size: int = SIZE) -> tuple[list[np.ndarray], np.ndarray]:
    """n images flattened to size² pixel tokens, half of them positive: (token ids, labels)."""
    if SIZE * SUPER % size:
        raise ValueError(f"image size {size}: must divide {SIZE * SUPER}")
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % 2)
    return [image(rng, int(y), size).reshape(-1).astype(np.int16) for y in labels], labels.astype(np.int64)
