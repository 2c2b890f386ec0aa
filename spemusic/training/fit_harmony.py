"""Fit the harmony tables (spemusic.music.harmony's Harmonizer) on a token cache's train split and score them
on its valid split: `python -m spemusic.training.fit_harmony CACHE OUT.json`. A training step, so it lives with
the training data it reads; the Harmonizer itself serves generation."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..music.harmony import Harmonizer, _scores, bars_of


def main() -> None:
    ap = argparse.ArgumentParser(description="Fit the harmony tables on a token cache (parts and chords).")
    ap.add_argument("cache", type=Path)
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    from .data import TokenCache

    cache = TokenCache.load(args.cache)
    tok = cache.tokenizer
    if not (tok.config.parts and tok.config.chords):
        raise SystemExit(f"{args.cache}: a cache with parts and chords is needed")
    train = [bars_of(s, tok) for s in cache.sequences("train")]
    valid = [bars_of(s, tok) for s in cache.sequences("valid")]
    h = Harmonizer.fit(train)
    exact, triad = _scores(h, valid)
    h.save(args.out)
    print(f"wrote {args.out}: valid bar accuracy {exact:.3f} exact, {triad:.3f} triad-level (root and third)")


if __name__ == "__main__":
    main()
