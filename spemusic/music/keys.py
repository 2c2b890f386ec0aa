"""Keys: their names, the key of a token sequence (Krumhansl-Kessler profiles), and transposing a
sequence (its pitched notes and its chord roots) by a number of semitones."""

from __future__ import annotations

import numpy as np

from ..errors import OptionError, SpemusicError
from ..tokens.tokenizer import REMITokenizer

NAMES = ("C", "C#", "D", "Eb", "E", "F", "F#", "G", "Ab", "A", "Bb", "B")
_SPELLINGS = {**{n.lower(): i for i, n in enumerate(NAMES)},
              **{n.lower(): i for i, n in enumerate(("C", "Db", "D", "D#", "E", "F", "Gb", "G", "G#", "A", "A#", "B"))},
              "cb": 11, "fb": 4, "e#": 5, "b#": 0}
_MODES = {"": "major", "major": "major", "maj": "major", "minor": "minor", "min": "minor", "m": "minor"}


def parse_key(text: str) -> tuple[int, str]:
    """'A minor', 'Am', 'F# major', 'Bb', 'c# min' -> (tonic pitch class, 'major' or 'minor')."""
    t = " ".join(text.strip().split())
    head = t[:2] if len(t) > 1 and t[1] in "#b" else t[:1]
    rest = t[len(head):].strip().lower()
    if head.lower() not in _SPELLINGS or rest not in _MODES:
        raise OptionError("{key} {text!r}: give a tonic and a mode, e.g. 'A minor', 'Am', 'F# major' or 'Bb'", text=text)
    return _SPELLINGS[head.lower()], _MODES[rest]


def key_name(tonic: int, mode: str) -> str:
    return f"{NAMES[tonic % 12]} {mode}"


def estimate_key(ids, tokenizer: REMITokenizer) -> tuple[int, str, float]:
    """The best-correlated of the 24 Krumhansl-Kessler key profiles for the duration-weighted
    pitch-class histogram: (tonic, mode, correlation). No pitched note: an error."""
    from .metrics import KK_MAJOR, KK_MINOR, note_grid, pitch_class_histogram

    h = pitch_class_histogram(note_grid(ids, tokenizer))
    if h.sum() == 0 or np.all(h == h[0]):
        raise SpemusicError("the piece has no pitched notes to find a key in")
    best = max(((float(np.corrcoef(h, np.roll(p, k))[0, 1]), k, mode)
                for mode, p in (("major", KK_MAJOR), ("minor", KK_MINOR)) for k in range(12)))
    return best[1], best[2], best[0]


def shift_to(found: tuple[int, str], asked: tuple[int, str]) -> int:
    """Semitones (-6..5) that move key `found` onto `asked`. Transposing keeps the mode, so a
    found key of the other mode is read as its relative (C major as A minor, A minor as C major)."""
    tonic, mode = found
    if mode != asked[1]:
        tonic = (tonic - 3) % 12 if mode == "major" else (tonic + 3) % 12
    return (asked[0] - tonic + 6) % 12 - 6


def transpose_ids(ids, tokenizer: REMITokenizer, shift: int) -> np.ndarray:
    """Pitched notes moved by `shift` semitones (an octave less or more where they would leave
    the MIDI range), chord roots with them; drums stay."""
    ids = np.asarray(ids, dtype=np.int64)
    lo, hi = tokenizer.range("Pitch")
    is_pitch = (ids >= lo) & (ids < hi)
    prev = np.concatenate([[-1], ids[:-1]])  # a Pitch token follows its Program token
    pitched = is_pitch & (prev != tokenizer.drum_program_id)
    if pitched.any():
        low, high = int(ids[pitched].min() - lo), int(ids[pitched].max() - lo)
        while high + shift > 127:
            shift -= 12
        while low + shift < 0:
            shift += 12
    out = ids.copy()
    out[pitched] += shift
    if tokenizer.config.chords:
        c_lo, c_hi = tokenizer.range("Chord")
        qualities = (c_hi - c_lo - 1) // 12  # root-major: 12 roots x qualities, then N
        chord = (ids >= c_lo) & (ids < c_hi - 1)
        root, quality = np.divmod(ids[chord] - c_lo, qualities)
        out[chord] = c_lo + ((root + shift) % 12) * qualities + quality
    return out
