"""Shapes: LRA's Image task (sequential CIFAR-10) made in code, at CPU scale.

LRA's Image task classifies 32x32 grey CIFAR-10 images read as 1,024 pixel tokens: the model
must find 2D structure in a 1D sequence, where the pixel below another is `SIZE` positions
further on. CIFAR-10 is a download; this task draws its images in numpy instead: eight classes of shapes
made of the same length of line (a horizontal and a vertical line, the four corners ┌ ┐ └ ┘, and
the tees ┬ ┴), each of a random size, place and brightness, on a background of a random grey,
SIZE x SIZE pixels (16 by default: 256 tokens, so that the seven models and three seeds fit in
about a CPU hour and a half). With noise and loose dashes about the shapes (NOISE, DISTRACTORS),
no model here left chance within the study's budget (docs/lra.md).

Every class has the same ink, so only where the bright pixels sit relative to each other tells
the classes apart: a horizontal line lights neighbours 1 position apart, a vertical one SIZE
apart, and a corner ┌ has its arms after its joint where ┘ has them before. A model without a
positional encoding sees a bag of pixel values and stays at chance (1 in 8); the shapes move
about the image, so an absolute encoding must learn each relation at every place, and a relative
one (SPE) can see it directly. (A first version with ten shapes of different ink, such as a
filled square against a line, was learned as well without any positional encoding: the ink alone
told most classes apart.)
"""

from __future__ import annotations

import numpy as np

SIZE, SUPER = 16, 8
CLASSES = 8
VOCAB_SIZE = 256
NAMES = ("horizontal line", "vertical line", "corner ┌", "corner ┐", "corner └", "corner ┘", "tee ┬", "tee ┴")
DISTRACTORS = 0      # loose dashes of 2 pixels
NOISE = 0.0          # background noise, standard deviation in grey levels


def _segment(canvas: np.ndarray, a, b, width: float = 1.0) -> None:
    """Draw the segment a-b (pixel coordinates, row then column) into the supersampled canvas."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    n = int(np.ceil(np.linalg.norm(b - a) * SUPER * 2)) + 1
    pts = (a[None] + (b - a)[None] * np.linspace(0, 1, n)[:, None]) * SUPER
    r = max(1, int(round(width * SUPER / 2)))
    for y, x in pts.astype(int):
        canvas[max(y - r, 0): y + r + 1, max(x - r, 0): x + r + 1] = 1.0


def _shape(canvas: np.ndarray, kind: int, top: float, left: float, length: float) -> None:
    """Draw shape `kind`, `length` pixels of line in all, in the box of side `length` whose
    top-left corner is (top, left)."""
    half = length / 2
    if kind == 0:
        _segment(canvas, (top + half, left), (top + half, left + length))
    elif kind == 1:
        _segment(canvas, (top, left + half), (top + length, left + half))
    elif kind <= 5:  # two arms of half the length from a corner: ┌ ┐ └ ┘
        down, right = kind in (2, 3), kind in (2, 4)
        corner = np.array([top + (0 if down else half), left + (0 if right else half)])
        _segment(canvas, corner, corner + (0, half if right else -half))
        _segment(canvas, corner, corner + (half if down else -half, 0))
    else:  # a bar of half the length and a stem of the other half from its middle: ┬ ┴
        row = top + (0 if kind == 6 else half)
        _segment(canvas, (row, left + length / 4), (row, left + 3 * length / 4))
        _segment(canvas, (row, left + half), (row + (half if kind == 6 else -half), left + half))


def image(rng: np.random.Generator, label: int, size: int = SIZE) -> np.ndarray:
    """One (size, size) uint8 image of shape `label`."""
    canvas = np.zeros((size * SUPER, size * SUPER), dtype=np.float32)
    length = rng.uniform(0.4, 0.7) * size
    top, left = rng.uniform(0.5, size - length - 1.5, size=2)
    _shape(canvas, label, top, left, length)
    for _ in range(DISTRACTORS):
        p = rng.uniform(1, size - 1, size=2)
        angle = rng.uniform(0, 2 * np.pi)
        _segment(canvas, p, np.clip(p + 2 * np.array([np.sin(angle), np.cos(angle)]), 0, size - 1))
    grey = canvas.reshape(size, SUPER, size, SUPER).mean((1, 3)) * rng.uniform(120, 255)
    grey += rng.normal(rng.uniform(20, 60), NOISE, size=grey.shape)
    return np.clip(np.round(grey), 0, 255).astype(np.uint8)


def generate(n: int, seed: int, size: int = SIZE) -> tuple[list[np.ndarray], np.ndarray]:
    """n images flattened to size² pixel tokens, the classes in equal shares: (token ids, labels)."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % CLASSES)
    return [image(rng, int(y), size).reshape(-1).astype(np.int16) for y in labels], labels.astype(np.int64)
