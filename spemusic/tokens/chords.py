"""Chords: a small vocabulary, Harte labels read from annotations, user names, and templates.

The vocabulary is the Pop Music Transformer's kind: 12 roots times a few qualities, plus
``N`` (no chord). Annotations in Harte notation (``B:maj``, ``E:min7``, ``F#:sus4(b7)``,
``C:maj/3``) map onto it: the bass note and added tones are dropped, and richer qualities fold
to the nearest one kept (``hdim7``, ``dim7`` -> ``dim``; ``maj6`` -> ``maj``; ``9`` -> ``7``).
Users write chords as musicians do (``C G Am F``, ``Bb7``, ``F#m7``, ``Csus4``) or in Harte form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import OptionError, SpemusicError
from .beats import AnnotationError, read_annotation

__all__ = ["QUALITIES", "ROOTS", "CHORD_NAMES", "ChordChange", "parse_chord", "read_chords", "parse_chords",
           "chord_templates", "best_chord"]

ROOTS = ("C", "C#", "D", "D#", "E", "F", "F#", "G", "G#", "A", "A#", "B")
# quality -> pitch classes above the root
QUALITIES: dict[str, tuple[int, ...]] = {
    "maj": (0, 4, 7), "min": (0, 3, 7), "dim": (0, 3, 6), "aug": (0, 4, 8), "sus2": (0, 2, 7),
    "sus4": (0, 5, 7), "7": (0, 4, 7, 10), "maj7": (0, 4, 7, 11), "min7": (0, 3, 7, 10),
}
NO_CHORD = "N"
# token names, in vocabulary order: root-major, then N (transposing shifts the root index)
CHORD_NAMES: tuple[str, ...] = tuple(f"{r}:{q}" for r in ROOTS for q in QUALITIES) + (NO_CHORD,)

_HARTE_FOLD = {
    "maj": "maj", "min": "min", "dim": "dim", "aug": "aug", "sus2": "sus2", "sus4": "sus4", "7": "7",
    "maj7": "maj7", "min7": "min7", "maj6": "maj", "min6": "min", "hdim7": "dim", "dim7": "dim",
    "minmaj7": "min", "9": "7", "11": "7", "13": "7", "maj9": "maj7", "maj11": "maj7", "maj13": "maj7",
    "min9": "min7", "min11": "min7", "min13": "min7", "5": "maj", "1": "maj",
}
# musicians' suffixes (after the root) -> quality
_SUFFIX = {
    "": "maj", "maj": "maj", "M": "maj", "m": "min", "min": "min", "-": "min", "dim": "dim", "o": "dim",
    "°": "dim", "aug": "aug", "+": "aug", "sus2": "sus2", "sus4": "sus4", "sus": "sus4", "7": "7",
    "dom7": "7", "maj7": "maj7", "M7": "maj7", "Δ": "maj7", "m7": "min7", "min7": "min7", "-7": "min7",
}
_ROOT_RE = re.compile(r"^([A-Ga-g])([#b♯♭]*)(.*)$")


def _root_index(letter: str, accidentals: str) -> int:
    pc = {"C": 0, "D": 2, "E": 4, "F": 5, "G": 7, "A": 9, "B": 11}[letter.upper()]
    return (pc + accidentals.count("#") + accidentals.count("♯") - accidentals.count("b") - accidentals.count("♭")) % 12


def parse_chord(label: str, harte_only: bool = False) -> str:
    """Vocabulary name (``"A:min"``, or ``"N"``) of a chord label. Raises ValueError if unknown."""
    s = label.strip()
    if s in ("N", "X", "NC", "N.C."):
        return NO_CHORD
    m = _ROOT_RE.match(s)
    if not m:
        raise ValueError(label)
    root = _root_index(m.group(1), m.group(2))
    rest = m.group(3)
    if rest.startswith(":") or harte_only:
        quality = rest.lstrip(":").split("/", 1)[0]
        base = quality.split("(", 1)[0] or "maj"
        folded = _HARTE_FOLD.get(base)
        if folded is None:
            folded = next((q for p, q in (("hdim", "dim"), ("dim", "dim"), ("min", "min"), ("maj", "maj"),
                                          ("aug", "aug"), ("sus2", "sus2"), ("sus", "sus4")) if base.startswith(p)),
                          None)
        if folded is None:
            raise ValueError(label)
    else:
        folded = _SUFFIX.get(rest.split("/", 1)[0])
        if folded is None:
            raise ValueError(label)
    return f"{ROOTS[root]}:{folded}"


@dataclass(frozen=True)
class ChordChange:
    time: float  # seconds
    name: str    # vocabulary name


def read_chords(path) -> list[ChordChange]:
    """Read a chord annotation: lines ``start end label`` (seconds; POP909's chord_midi.txt, the
    Isophonics .lab form) or ``start label``. Consecutive equal chords are merged."""
    text = read_annotation(path, "chord")
    out: list[ChordChange] = []
    last = -1.0
    for n, line in enumerate(text.splitlines(), 1):
        cols = line.split()
        if not cols or cols[0].startswith("#"):
            continue
        if len(cols) not in (2, 3):
            raise AnnotationError(f"{path} line {n}: unknown chord format (expected 'start end label')")
        try:
            start = float(cols[0])
        except ValueError:
            raise AnnotationError(f"{path} line {n}: not a time ({cols[0]!r})") from None
        try:
            name = parse_chord(cols[-1], harte_only=True)
        except ValueError:
            raise AnnotationError(f"{path} line {n}: unknown chord {cols[-1]!r}") from None
        if start < last:
            raise AnnotationError(f"{path} line {n}: times not increasing")
        last = start
        if not out or out[-1].name != name:
            out.append(ChordChange(start, name))
    if not out:
        raise AnnotationError(f"{path}: empty chord annotation")
    return out


def _all_chords(text: str) -> bool:
    try:
        return all(parse_chord(label) for label in re.split(r"[\s,|]+", text.strip()) if label)
    except ValueError:
        return False


def parse_chords(spec: str) -> list[str]:
    """A progression for ``generate --chords``: names separated by spaces, commas or bar lines,
    or a file with one chord per line (or several per line, one per bar)."""
    p = Path(spec)
    text = spec
    if "\n" not in spec and (p.exists() or p.is_symlink() or "/" in spec or p.suffix) and not _all_chords(spec):
        from ..files import check_input_file

        check_input_file(p, missing="no such chord file")  # a folder, a FIFO or a device named as such
        if p.stat().st_size > 1_000_000:
            raise SpemusicError(f"{spec}: {p.stat().st_size:,} bytes is too big for a chord file")
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise SpemusicError(f"{spec}: cannot read chord file ({getattr(e, 'strerror', None) or e})") from None
    names = []
    for label in re.split(r"[\s,|]+", text.strip()):
        if not label:
            continue
        try:
            names.append(parse_chord(label))
        except ValueError:
            raise SpemusicError(
                f"unknown chord {label!r}: use a root (C, C#, Db … B) with one of "
                f"'' (major), m, dim, aug, sus2, sus4, 7, maj7, m7, or N (no chord); e.g. 'C G Am F'") from None
    if not names:
        raise OptionError("{chords}: no chords given (e.g. {chords} 'C G Am F')")
    return names


def chord_templates() -> np.ndarray:
    """(len(CHORD_NAMES) - 1, 12) unit-norm pitch-class templates, one per chord (N excluded)."""
    t = np.zeros((len(CHORD_NAMES) - 1, 12))
    for i, name in enumerate(CHORD_NAMES[:-1]):
        root, q = name.split(":")
        t[i, [(ROOTS.index(root) + iv) % 12 for iv in QUALITIES[q]]] = 1.0
    return t / np.linalg.norm(t, axis=1, keepdims=True)


def best_chord(pc_hist: np.ndarray) -> str | None:
    """The chord whose template best matches a (duration-weighted) pitch-class histogram, by
    cosine; None for an empty histogram."""
    h = np.asarray(pc_hist, dtype=np.float64)
    if h.sum() <= 0:
        return None
    return CHORD_NAMES[int(np.argmax(chord_templates() @ h))]
