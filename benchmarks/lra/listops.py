"""ListOps (Nangia & Bowman 2018) as the Long Range Arena generates it, brackets kept.

A tree of the operators MIN, MAX, MED (the median, truncated to an integer) and SM (the sum
modulo 10) over digits: at each depth below 10 a node is a digit with probability 3/4, else an
operator over 2 to 10 children. Trees of 500 to 2,000 tokens are kept (the LRA bounds, both
strict), each distinct once; the label is the tree's value, 0-9.

Tokens are the operators, the digits and the closing bracket `]` (the LRA generator's string
also has parentheses around every pair, which its fixed input pipeline strips). The runs behind
the SPE paper read the inputs through a tokenizer that dropped the brackets as well, which
leaves the task without its structure (LRA issue #20); here they are kept.
"""

from __future__ import annotations

import random

import numpy as np

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
VOCAB = ("<pad>", *OPERATORS, "]", *(str(d) for d in range(10)))
TOKEN_ID = {t: i for i, t in enumerate(VOCAB)}
CLASSES = 10
MAX_DEPTH, MAX_ARGS, LEAF_P = 10, 10, 0.75
MIN_LENGTH, MAX_LENGTH = 500, 2000


def _tree(rng: random.Random, depth: int) -> tuple[list[str], int]:
    """(tokens, value) of a random tree below `depth`."""
    if depth >= MAX_DEPTH or rng.random() < LEAF_P:
        d = rng.randrange(10)
        return [str(d)], d
    op = rng.choice(OPERATORS)
    tokens, values = [op], []
    for _ in range(rng.randint(2, MAX_ARGS)):
        t, v = _tree(rng, depth + 1)
        tokens += t
        values.append(v)
    tokens.append("]")
    if op == "[MIN":
        value = min(values)
    elif op == "[MAX":
        value = max(values)
    elif op == "[MED":
        value = int(np.median(values))
    else:
        value = sum(values) % 10
    return tokens, value


Examples = tuple[list[np.ndarray], np.ndarray]  # token ids per example, labels


def generate(n: int, seed: int, lengths: tuple[int, int] = (MIN_LENGTH, MAX_LENGTH)) -> Examples:
    """n distinct trees of lengths[0] < length < lengths[1] tokens: (token ids, labels)."""
    shortest, longest = lengths
    rng = random.Random(seed)
    seen, seqs, labels = set(), [], []
    while len(seqs) < n:
        tokens, value = _tree(rng, 1)
        if not shortest < len(tokens) < longest:
            continue
        key = " ".join(tokens)
        if key in seen:
            continue
        seen.add(key)
        seqs.append(np.array([TOKEN_ID[t] for t in tokens], dtype=np.int16))
        labels.append(value)
    return seqs, np.array(labels, dtype=np.int64)


def evaluate(ids) -> int:
    """The value of a tree given as token ids (a stack machine: the generator's label, computed
    from the tokens alone)."""
    stack: list[list] = []
    value = None
    for i in ids:
        t = VOCAB[int(i)]
        if t in OPERATORS:
            stack.append([t])
        elif t == "]":
            op, *vals = stack.pop()
            value = {"[MIN": min, "[MAX": max, "[MED": lambda v: int(np.median(v)),
                     "[SM": lambda v: sum(v) % 10}[op](vals)
            if stack:
                stack[-1].append(value)
        else:
            value = int(t)
            if stack:
                stack[-1].append(value)
    return value


def first_token_accuracy(train: Examples, test: Examples) -> float:
    """Test accuracy (%) of answering, for each root operator (the first token), the value most
    frequent under it in `train`: what a model reading the first token alone reaches. MAX of
    2 to 10 arguments, most of them digits, is mostly 9; MIN mostly 0."""
    first = np.array([s[0] for s in train[0]])
    best = {op: np.bincount(train[1][first == op], minlength=CLASSES).argmax() for op in np.unique(first)}
    guesses = np.array([best.get(s[0], 0) for s in test[0]])
    return float(100 * np.mean(guesses == test[1]))
