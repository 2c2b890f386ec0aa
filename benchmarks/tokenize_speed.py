"""Tokenization speed: spemusic REMI vs MidiTok 3 REMI, one process, on POP909.

    python benchmarks/tokenize_speed.py [MIDI_DIR] [--limit N]   (default ../shared/data/pop909)

Prints files/s and tokens/s for both (each tokenizer reads the files itself,
from disk, in the same run), the ratio, and where spemusic's time goes
(file read + symusic parse vs numpy encode).  MidiTok is a benchmark-only
dependency (pip install miditok); without it its line says so.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spemusic.tokens.tokenizer import REMITokenizer


def bench_spemusic(files: list[Path]) -> dict:
    tok = REMITokenizer()
    tok.encode(files[0])  # warm up (imports, caches)
    t_read = t_enc = 0.0
    tokens = 0
    t0 = time.perf_counter()
    for f in files:
        a = time.perf_counter()
        p = tok._read(f)  # file read + symusic parse + arrays out of the Score
        b = time.perf_counter()
        ids, _ = tok._encode_parsed(p)  # quantise, bars, tempo, token layout (numpy)
        c = time.perf_counter()
        t_read += b - a
        t_enc += c - b
        tokens += len(ids)
    total = time.perf_counter() - t0
    # the public call, end to end, to be sure the split adds up
    t1 = time.perf_counter()
    tokens2 = sum(len(tok.encode(f)) for f in files)
    total_public = time.perf_counter() - t1
    assert tokens2 == tokens
    return dict(seconds=total_public, tokens=tokens, read=t_read, encode=t_enc, split_total=total)


def bench_miditok(files: list[Path]) -> dict | None:
    try:
        import miditok
    except ImportError:
        return None
    cfg = miditok.TokenizerConfig(
        use_programs=True,
        use_tempos=True,
        use_time_signatures=True,
        beat_res={(0, 4): 8, (4, 12): 4},
        num_velocities=32,
    )
    tok = miditok.REMI(cfg)
    tok.encode(files[0])
    tokens = 0
    t0 = time.perf_counter()
    for f in files:
        seq = tok.encode(f)
        if isinstance(seq, list):
            tokens += sum(len(s.ids) for s in seq)
        else:
            tokens += len(seq.ids)
    from importlib.metadata import version

    return dict(seconds=time.perf_counter() - t0, tokens=tokens, version=version("miditok"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("midi_dir", nargs="?", default=str(Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "pop909"))
    ap.add_argument("--limit", type=int, default=0, help="only the first N files")
    args = ap.parse_args()
    files = sorted(p for p in Path(args.midi_dir).rglob("*") if p.suffix.lower() in (".mid", ".midi"))
    if args.limit:
        files = files[: args.limit]
    if not files:
        print(f"no MIDI files under {args.midi_dir}", file=sys.stderr)
        return 1
    n = len(files)
    print(f"{n} files from {args.midi_dir}, one process")
    s = bench_spemusic(files)
    print(f"spemusic REMI : {n / s['seconds']:8.1f} files/s  {s['tokens'] / s['seconds']:12,.0f} tokens/s  "
          f"({s['tokens']:,} tokens, {s['seconds']:.2f} s)")
    tot = s["read"] + s["encode"]
    print(
        f"  where the time goes: read+parse (open, symusic C++ parse, note arrays) "
        f"{s['read']:.2f} s ({100 * s['read'] / tot:.0f}%), "
        f"numpy encode {s['encode']:.2f} s ({100 * s['encode'] / tot:.0f}%); "
        f"{1000 * tot / n:.2f} ms per file"
    )
    m = bench_miditok(files)
    if m is None:
        print("MidiTok REMI  : miditok is not installed (pip install miditok) -- no comparison")
        return 0
    print(f"MidiTok {m['version']} REMI: {n / m['seconds']:8.1f} files/s  {m['tokens'] / m['seconds']:12,.0f} tokens/s  "
          f"({m['tokens']:,} tokens, {m['seconds']:.2f} s)")
    print(
        f"ratio spemusic/MidiTok: {m['seconds'] / s['seconds']:.1f}x files/s, "
        f"{(s['tokens'] / s['seconds']) / (m['tokens'] / m['seconds']):.1f}x tokens/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
