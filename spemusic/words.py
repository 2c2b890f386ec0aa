"""Counts in messages, in correct English for one and for many."""

from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``count(1, "bar")`` -> "1 bar", ``count(3, "bar")`` -> "3 bars" (thousands separated)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def verb(n: int, singular: str, plural: str) -> str:
    """The verb that agrees with a count: ``verb(1, "holds", "hold")`` -> "holds"."""
    return singular if n == 1 else plural
