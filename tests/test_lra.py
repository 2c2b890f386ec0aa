"""The LRA benchmark's data and models (benchmarks/lra): ListOps labels are the trees' values,
Pathfinder and Shapes images are balanced and in range, Shapes' classes differ in arrangement and
not in ink, and every model trains a step and classifies."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "lra"))
import listops
import pathfinder
import shapes
from models import MODELS, Classifier, loss_and_hits


def test_listops_labels_are_the_values_of_the_trees():
    ids = lambda s: [listops.TOKEN_ID[t] for t in s.split()]  # noqa: E731
    assert listops.evaluate(ids("[MAX 2 9 [MIN 4 7 ] 0 ]")) == 9
    assert listops.evaluate(ids("[MED 3 4 6 9 ]")) == 5  # the mean of the middle two, truncated
    assert listops.evaluate(ids("[SM 8 [MAX 5 6 ] ]")) == 4
    seqs, labels = listops.generate(30, seed=0)
    assert all(listops.MIN_LENGTH < len(s) < listops.MAX_LENGTH for s in seqs)
    assert [listops.evaluate(s) for s in seqs] == labels.tolist()
    assert len({s.tobytes() for s in seqs}) == 30
    again, _ = listops.generate(30, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(seqs, again))


def test_pathfinder_images():
    seqs, labels = pathfinder.generate(20, seed=0)
    assert sorted(labels.tolist()) == [0] * 10 + [1] * 10
    img = np.stack(seqs)
    assert img.shape == (20, 1024) and img.min() >= 0 and img.max() == 255


def test_pathfinder_images_averaged_down():
    seqs, _ = pathfinder.generate(4, seed=0, size=16)
    assert np.stack(seqs).shape == (4, 256)
    with pytest.raises(ValueError, match="must divide"):
        pathfinder.generate(4, seed=0, size=24)


def test_shapes_differ_in_arrangement_not_in_ink():
    seqs, labels = shapes.generate(400, seed=0)
    assert np.bincount(labels).tolist() == [50] * shapes.CLASSES
    images = np.stack(seqs).reshape(-1, shapes.SIZE, shapes.SIZE).astype(float)
    ink = (images - np.median(images, axis=(1, 2), keepdims=True)).clip(0).sum((1, 2))
    per_class = np.array([ink[labels == c].mean() for c in range(shapes.CLASSES)])
    assert per_class.max() / per_class.min() < 1.1  # the same length of line in every class

    def spread(image: np.ndarray) -> tuple[float, float]:
        """How far the bright pixels spread down the rows and across the columns."""
        rows, cols = np.nonzero(image > image.max() / 2)
        return rows.std(), cols.std()

    for image, label in zip(images, labels):
        if label in (0, 1):  # a horizontal line spreads across, a vertical one down
            down, across = spread(image)
            assert (across > down) == (label == 0)


@pytest.mark.parametrize("kind", MODELS)
def test_every_model_trains_and_classifies(kind):
    torch.manual_seed(0)
    model = Classifier(kind, vocab_size=16, classes=10, max_len=64)
    ids = torch.randint(1, 16, (3, 40))
    mask = torch.ones(3, 40, dtype=torch.bool)
    mask[0, 30:] = False
    loss, _ = loss_and_hits(model, ids, mask, torch.tensor([1, 2, 3]))
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.eval()
    with torch.no_grad():
        a = model(ids, mask)
        b = model(torch.where(mask, ids, 0), mask)  # what sits under the padding does not count
    torch.testing.assert_close(a[0], b[0])
