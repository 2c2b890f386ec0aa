"""Fuzz pass of the MIDI reader: odd MIDI files, built here in code, through `spemusic tokenize`,
`spemusic continue`, `spemusic eval --metrics`, `spemusic render` and `spemusic show`; then
concurrent writers of one output name.

    python benchmarks/fuzz_midi.py [--only 40] [--keep DIR] [--timeout 20] [--memory-gb 2] [--writers 4]

The files: three well-formed pieces (one track; a conductor track, a piano track with pedal, pitch
bends and running status, and a drum track; one with system exclusive and text events), then
each of them cut at every chunk boundary (and inside the chunk header and the chunk), with every
chunk's length field wrong, with odd header fields (format, track count, ticks per beat, SMPTE),
extreme event values (tempo, time and key signatures, short meta events, pitch, velocity,
controller, program and pitch-bend bytes above 127), huge delta times (one of 2^28 - 1, a note
past tick 2^31, a note 2^28 ticks long, a five-byte length), many tracks (1,000 of them; 65,535
empty ones), bytes no reader can follow (a data byte with no status, system common bytes, a
system exclusive or meta event longer than the file), and random byte changes (seeded).

Each file goes through the commands in a worker process (the commands run in it through
spemusic's own entry point, so the shipped model loads once per worker): `tokenize FILE -o
FILE.txt`, `continue FILE --length 64 --seed 0 -o FILE-c.mid` (the shipped models), `eval
--metrics FILE`, `render FILE -o FILE.wav` and `show FILE -o FILE.png`. A command passes when it
exits 0 with its output written (the continuation read back by symusic and miditoolkit, the audio
by soundfile, the picture non-empty), or exits 1 or 2 with one line of error; it fails on a
traceback, any other exit code, more than --timeout seconds (the worker is killed and restarted)
or more than --memory-gb of address space (RLIMIT_AS: a MemoryError, or a worker that dies).
The reader policy is one: a file that tokenize accepts, continue, render and show accept too, and
the other way round.

Concurrent writers: --writers processes started together write one output name (generate,
continue, render, show), first without --overwrite (exactly one may say "wrote"; the others must
refuse in one line, and the file left must be the winner's), then with it (all succeed, and the
file is one whole writer's output).
Prints the counts per command and outcome, and every failure; exits 1 if there is one.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import resource
import select
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# ----------------------------------------------------------------------------- building MIDI bytes


def vlq(n: int) -> bytes:
    out = [n & 0x7F]
    n >>= 7
    while n:
        out.append(0x80 | (n & 0x7F))
        n >>= 7
    return bytes(reversed(out))


def chunk(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack(">I", len(body)) + body


def header(fmt: int = 0, tracks: int = 1, tpq: int = 480) -> bytes:
    return chunk(b"MThd", struct.pack(">HHH", fmt, tracks, tpq))


def track(*events: bytes, end: bool = True) -> bytes:
    return chunk(b"MTrk", b"".join(events) + (b"\x00\xff\x2f\x00" if end else b""))


def meta(kind: int, data: bytes, dt: int = 0) -> bytes:
    return vlq(dt) + bytes([0xFF, kind]) + vlq(len(data)) + data


def tempo(mspq: int, dt: int = 0) -> bytes:
    return meta(0x51, mspq.to_bytes(3, "big"), dt)


def timesig(num: int, den_exp: int, dt: int = 0) -> bytes:
    return meta(0x58, bytes([num, den_exp, 24, 8]), dt)


def keysig(sf: int, mode: int) -> bytes:
    return meta(0x59, bytes([sf & 0xFF, mode]))


def note(pitch: int, vel: int = 100, length: int = 240, dt: int = 0, ch: int = 0) -> bytes:
    return vlq(dt) + bytes([0x90 | ch, pitch, vel]) + vlq(length) + bytes([0x80 | ch, pitch, 0])


def scale(n: int = 16, ch: int = 0, length: int = 240) -> bytes:
    return b"".join(note(60 + (2 * i) % 12, 90, length, 0, ch) for i in range(n))


def simple() -> bytes:
    return header() + track(tempo(500000), timesig(4, 2), keysig(0, 0), scale())


def multi() -> bytes:
    conductor = track(tempo(600000), timesig(3, 2), keysig(-3, 1), meta(0x06, b"C:maj"), meta(0x01, b"text"),
                      tempo(400000, 1440), timesig(4, 2, 1440))
    running = b"\x00\x90\x40\x50" + b"".join(vlq(120) + bytes([p, 80]) for p in (64, 67, 72)) + \
        b"".join(vlq(120) + bytes([p, 0]) for p in (64, 67, 72, 64))  # running status: one status byte
    piano = track(b"\x00\xc0\x00", b"\x00\xb0\x40\x7f", running, b"\x00\xe0\x00\x50", scale(8),
                  b"\x00\xb0\x40\x00")
    drums = track(*(note(36 + (i % 3) * 2, 100, 60, 120, 9) for i in range(16)))
    return header(1, 3) + conductor + piano + drums


def with_sysex() -> bytes:
    return header() + track(b"\x00\xf0\x05\x7e\x7f\x09\x01\xf7", b"\x00\xf7\x02\xf3\x01", meta(0x7F, b"\x00\x41"),
                            meta(0x05, b"la"), meta(0x03, b"name"), scale(12))


BASES = {"simple": simple(), "multi": multi(), "sysex": with_sysex()}


def chunks(data: bytes) -> list[tuple[int, int]]:
    """(start, declared length) of each chunk."""
    out, pos = [], 0
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos + 4:pos + 8], "big")
        out.append((pos, length))
        pos += 8 + length
    return out


def odd_files(seed: int = 0) -> list[tuple[str, bytes]]:
    """At least 200 odd MIDI files, always the same ones for a seed: (name, bytes)."""
    files: list[tuple[str, bytes]] = list(BASES.items())
    add = lambda name, data: files.append((name, data))  # noqa: E731
    for base, data in BASES.items():
        for i, (start, length) in enumerate(chunks(data)):  # cut at and around every chunk boundary
            for cut in sorted({start, start + 4, start + 8, start + 8 + length // 2, start + 8 + length - 1}):
                if 0 < cut < len(data):
                    add(f"{base}-cut-chunk{i}-at{cut}", data[:cut])
            for name, wrong in (("0", 0), ("minus1", length - 1), ("plus1", length + 1), ("plus100", length + 100),
                                ("half", length // 2), ("max", 2**32 - 1)):  # wrong chunk lengths
                add(f"{base}-chunk{i}-length-{name}", data[:start + 4] + struct.pack(">I", wrong) + data[start + 8:])
        add(f"{base}-trailing-garbage", data + bytes(range(256)))
        add(f"{base}-unknown-chunk", data[:14] + chunk(b"XFIH", b"\x01\x02\x03") + data[14:])
    body = simple()[14:]
    for fmt in (1, 2, 3, 255, 0xFFFF):
        add(f"format-{fmt}", header(fmt, 1) + body)
    for n in (0, 2, 4, 255, 65535):
        add(f"header-says-{n}-tracks", header(1, n) + body)
    for tpq in (0, 1, 3, 7, 0x7FFF, 0x8000, 0xE728, 0xE250, 0xFFFF):
        add(f"ticks-per-beat-{tpq:#x}", header(0, 1, tpq) + body)
    for size in (0, 5, 7, 12):
        add(f"header-length-{size}", b"MThd" + struct.pack(">I", size) + (struct.pack(">HHH", 0, 1, 480) + b"\0" * 6)[:size]
            + body)

    def one(name: str, *events: bytes, **kw) -> None:
        add(name, header(**kw) + track(*events, scale(8)))

    for mspq in (0, 1, 2, 0xFFFFFF, 0x7FFFFF):  # extreme values
        one(f"tempo-mspq-{mspq}", tempo(mspq))
    one("tempo-at-tick-2^28", tempo(500000, 2**28 - 1))
    for size in (0, 1, 2, 5):
        one(f"tempo-meta-of-{size}-bytes", meta(0x51, b"\x07\xa1\x20\x00\x00"[:size]))
    for num, den in ((0, 0), (0, 2), (255, 255), (4, 0), (3, 7), (7, 8), (1, 31), (255, 2), (3, 255), (1, 6)):
        one(f"timesig-{num}-{den}", timesig(num, den))
    for size in (0, 1, 2, 3, 6):
        one(f"timesig-meta-of-{size}-bytes", meta(0x58, b"\x04\x02\x18\x08\x00\x00"[:size]))
    for sf, mode in ((-8, 0), (8, 1), (127, 0), (-128, 0), (0, 2), (0, 255)):
        one(f"keysig-{sf}-{mode}", keysig(sf, mode))
    for size in (0, 1, 3):
        one(f"keysig-meta-of-{size}-bytes", meta(0x59, b"\x00\x00\x00"[:size]))
    for p in (0, 127, 128, 200, 255):
        one(f"pitch-byte-{p}", note(p))
    for v in (0, 1, 127, 128, 255):
        one(f"velocity-byte-{v}", note(60, v))
    for number, value in ((128, 0), (7, 128), (255, 255), (64, 200)):
        one(f"controller-{number}-{value}", bytes([0, 0xB0, number, value]))
    for program in (127, 128, 255):
        one(f"program-{program}", bytes([0, 0xC0, program]))
    for lsb, msb in ((0xFF, 0xFF), (0x80, 0x00), (0x00, 0x80)):
        one(f"pitch-bend-{lsb:02x}{msb:02x}", bytes([0, 0xE0, lsb, msb]))
    one("aftertouch-255", b"\x00\xa0\x3c\xff", b"\x00\xd0\xff")
    one("delta-2^28-1", note(60, dt=2**28 - 1))  # huge delta times
    one("note-past-tick-2^31", *(tempo(500000, 2**28 - 1) for _ in range(8)), note(60, dt=2**28 - 1))
    one("note-2^28-ticks-long", note(60, length=2**28 - 1))
    one("five-byte-delta", b"\xff\xff\xff\xff\x7f\x90\x3c\x40")
    one("note-on-without-off", b"\x00\x90\x3c\x40")
    one("note-off-without-on", b"\x00\x80\x3c\x40")
    one("off-before-on", b"\x00\x80\x3c\x40\x00\x90\x3c\x40\x83\x60\x80\x3c\x00")
    one("zero-length-notes", *(note(60 + i, length=0) for i in range(8)))
    one("1000-overlapping-unisons", *(b"\x00\x90\x3c\x40" for _ in range(1000)), b"\x83\x60\x80\x3c\x00")
    one("20000-notes-at-one-tick", *(bytes([0, 0x90, 36 + i % 60, 64]) for i in range(20000)),
        vlq(480), *(bytes([0, 0x80, 36 + i % 60, 0]) for i in range(20000)))
    one("every-tick-for-5000-ticks", *(note(40 + i % 48, 64, 480, 1) for i in range(5000)))
    one("all-16-channels", *(note(60, 80, 240, 0, ch) for ch in range(16)))
    add("1000-tracks", header(1, 1000) + b"".join(track(note(40 + i % 60)) for i in range(1000)))
    add("256-drum-tracks", header(1, 256) + b"".join(track(note(36, ch=9)) for _ in range(256)))
    add("65535-tracks", header(1, 65535) + track(scale(8)) + track() * 65534)
    add("65535-tracks-declared-3-present", header(1, 65535) + track(scale(8)) * 3)
    add("no-end-of-track", header() + track(scale(8), end=False))
    add("end-of-track-then-notes", header() + chunk(b"MTrk", b"\x00\xff\x2f\x00" + scale(8) + b"\x00\xff\x2f\x00"))
    one("data-byte-without-status", b"\x00\x3c\x40")  # bytes no reader can follow
    add("data-byte-first", header() + chunk(b"MTrk", b"\x00\x3c\x40" + scale(4) + b"\x00\xff\x2f\x00"))
    for b in (0xF1, 0xF2, 0xF3, 0xF6, 0xF8, 0xF9, 0xFE):
        one(f"system-byte-{b:02x}", bytes([0, b, 0x01, 0x01]))
    one("sysex-longer-than-file", b"\x00\xf0\x8f\xff\xff\x7f\x01")
    one("meta-longer-than-file", b"\x00\xff\x01\x8f\xff\xff\x7f\x41")
    one("meta-type-2f-early", b"\x00\xff\x2f\x00")
    one("only-meta", meta(0x01, b"x" * 1000))
    add("empty-track", header() + track())
    add("header-only", header())
    add("no-tracks-at-all", header(0, 0))
    rng = random.Random(seed)  # random byte changes, seeded
    for base, data in BASES.items():
        for i in range(25):
            b = bytearray(data)
            kind = i % 5
            if kind < 3:  # flip 1, 4 or 16 bytes after the header
                for _ in range((1, 4, 16)[kind]):
                    b[rng.randrange(14, len(b))] = rng.randrange(256)
            elif kind == 3:  # insert a few bytes
                at = rng.randrange(14, len(b))
                b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6)))
            else:  # delete a few
                at = rng.randrange(14, len(b) - 6)
                del b[at:at + rng.randrange(1, 6)]
            add(f"{base}-random-{i}", bytes(b))
    names = [n for n, _ in files]
    assert len(names) == len(set(names)), "file names must be unique"
    return files


# ----------------------------------------------------------------------------- running the commands

COMMANDS = ("tokenize", "continue", "eval --metrics", "render", "show")


def command_args(cmd: str, path: Path) -> list[str]:
    if cmd == "tokenize":
        return ["tokenize", str(path), "-o", str(path.with_suffix(".txt")), "--overwrite"]
    if cmd == "continue":
        return ["continue", str(path), "--length", "64", "--seed", "0", "-o", str(path.with_name(path.stem + "-c.mid")),
                "--overwrite"]
    if cmd == "render":
        return ["render", str(path), "-o", str(path.with_suffix(".wav")), "--overwrite"]
    if cmd == "show":
        return ["show", str(path), "-o", str(path.with_suffix(".png")), "--overwrite"]
    return ["eval", "--metrics", str(path)]


def run_in_process(args: list[str]) -> tuple[int | str, str]:
    """Run `spemusic ARGS` through its entry point (the console script's, pyproject.toml) in this
    process: (exit code, or 'traceback: ...'; stderr)."""
    from spemusic._start import main

    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["spemusic", *args]
    code: int | str = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except MemoryError:
            code = "memory"
        except BaseException as e:  # noqa: BLE001 - what the command line would print as a traceback
            code = f"traceback: {type(e).__name__}: {str(e)[:200]}"
    return code, err.getvalue()


def judge(cmd: str, path: Path, code, err: str) -> str:
    """The outcome of one command: ok, ok+warning, error (one line), or a failure."""
    if isinstance(code, str):
        return "memory" if code == "memory" else code
    if "Traceback" in err:
        return "traceback in stderr"
    lines = [line for line in err.splitlines() if line.strip()]
    if code == 0:
        if cmd == "continue":
            out = path.with_name(path.stem + "-c.mid")
            try:
                import miditoolkit
                import symusic

                symusic.Score(str(out))
                miditoolkit.MidiFile(str(out))
            except Exception as e:  # noqa: BLE001
                return f"output unreadable: {type(e).__name__}: {str(e)[:100]}"
        if cmd == "tokenize" and not path.with_suffix(".txt").stat().st_size:
            return "empty output"
        if cmd == "render":
            try:
                import soundfile

                info = soundfile.info(str(path.with_suffix(".wav")))
                if info.frames <= 0:
                    return "empty output"
            except Exception as e:  # noqa: BLE001
                return f"output unreadable: {type(e).__name__}: {str(e)[:100]}"
        if cmd == "show" and not path.with_suffix(".png").stat().st_size:
            return "empty output"
        return "ok, with a warning" if any(line.startswith("warning:") for line in lines) else "ok"
    if code in (1, 2):
        errors = [line for line in lines if line.startswith("error:")]
        if len(errors) == 1 and lines[-1] == errors[0]:
            return "one-line error"
        return f"error not on one line: {err[:200]!r}"
    return f"exit code {code}"


FAILED = ("traceback", "memory", "error not", "exit code", "output", "empty output", "hang", "worker died")


def worker(memory_gb: float) -> None:
    """Read file paths on stdin; for each, run the three commands and write one JSON line each."""
    limit = int(memory_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for line in sys.stdin:
        path = Path(line.strip())
        for cmd in COMMANDS:
            t0 = time.perf_counter()
            code, err = run_in_process(command_args(cmd, path))
            outcome = judge(cmd, path, code, err)
            first = next((x for x in err.splitlines() if x.startswith(("error:", "warning:"))), "")
            print(json.dumps({"cmd": cmd, "outcome": outcome, "seconds": round(time.perf_counter() - t0, 2),
                              "line": first[:200], "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}),
                  file=sys.__stdout__, flush=True)


class Worker:
    def __init__(self, memory_gb: float):
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", "--memory-gb", str(memory_gb)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, bufsize=1)
        self.fresh = True

    def result(self, timeout: float) -> dict | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {}

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def concurrent_writers(folder: Path, n: int) -> list[str]:
    """`n` processes started together write one output name, per command: without --overwrite
    exactly one may report "wrote" and the others refuse in one line; with it all succeed. The
    file left is whole (read back). Returns the failures."""
    repo = Path(__file__).resolve().parents[1]
    prompt = repo / "data" / "examples" / "piano.mid"
    cases = {
        "generate": lambda out: ["generate", "--bars", "1", "--seed", "0", "-o", str(out)],
        "continue": lambda out: ["continue", str(prompt), "--bars", "1", "--seed", "0", "-o", str(out)],
        "render": lambda out: ["render", str(prompt), "-o", str(out)],
        "show": lambda out: ["show", str(prompt), "-o", str(out)],
    }
    suffix = {"generate": ".mid", "continue": ".mid", "render": ".wav", "show": ".png"}
    failures = []
    print(f"\n{n} concurrent writers of one output name")
    for cmd, make in cases.items():
        for overwrite in (False, True):
            out = folder / f"same-{cmd}{suffix[cmd]}"
            out.unlink(missing_ok=True)
            extra = ["--overwrite"] if overwrite else []
            procs = [subprocess.Popen([sys.executable, "-m", "spemusic", *make(out), *extra], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=repo) for _ in range(n)]
            results = [(p.wait(), p.stderr.read()) for p in procs]
            ok = [r for r in results if r[0] == 0]
            # (a refusal after sampling comes below the progress bar's last line)
            errors = [[x for x in e.splitlines() if x.startswith("error:")] for _, e in results]
            refused = [r for r, er in zip(results, errors) if r[0] != 0 and len(er) == 1 and "already exists" in er[0]
                       and r[1].strip().splitlines()[-1] == er[0]]
            whole = out.exists() and out.stat().st_size > 0
            if whole and suffix[cmd] == ".mid":
                try:
                    import symusic

                    symusic.Score(str(out))
                except Exception:  # noqa: BLE001
                    whole = False
            good = (len(ok) == n) if overwrite else (len(ok) == 1 and len(refused) == n - 1)
            label = f"{cmd:<9} {'--overwrite' if overwrite else 'no --overwrite':<15}"
            print(f"  {label} {len(ok)} wrote, {len(refused)} refused in one line, file whole: {whole}"
                  f"  {'ok' if good and whole else 'FAILED'}")
            if not (good and whole):
                failures.append(f"concurrent {label.strip()}: " + " | ".join(e.strip()[:120] for _, e in results))
    return failures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", type=int, default=0, help="only every k-th file, for about this many files (0: all)")
    ap.add_argument("--keep", type=Path, help="write the files (and outputs) here instead of a temporary folder")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per command")
    ap.add_argument("--memory-gb", type=float, default=2.0, help="address space of the worker (RLIMIT_AS)")
    ap.add_argument("--writers", type=int, default=4, help="processes writing one output name at once (0: skip)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.memory_gb)
        return
    files = odd_files()
    if args.only:
        files = files[:: max(1, len(files) // args.only)]
    folder = args.keep or Path(tempfile.mkdtemp(prefix="fuzz-midi-"))
    folder.mkdir(parents=True, exist_ok=True)
    counts = {cmd: {} for cmd in COMMANDS}
    failures, slowest, peak, accepted, log = [], (0.0, ""), 0, {}, []
    t_start = time.perf_counter()
    w = Worker(args.memory_gb)
    for i, (name, data) in enumerate(files):
        path = folder / f"{i:03d}-{name}.mid"
        path.write_bytes(data)
        w.proc.stdin.write(f"{path}\n")
        w.proc.stdin.flush()
        for cmd in COMMANDS:
            r = w.result(args.timeout + (60 if w.fresh else 0))  # a new worker first imports torch, loads the model
            w.fresh = w.fresh and cmd != "continue"
            if not r:
                outcome = "worker died (crash or memory)" if r == {} else f"hang (over {args.timeout:.0f} s)"
                r = {"outcome": outcome, "seconds": args.timeout, "line": ""}
            counts[cmd][r["outcome"]] = counts[cmd].get(r["outcome"], 0) + 1
            # (a refusal for want of memory is no reading of the file: "would need ... GiB")
            accepted.setdefault(path.name, {})[cmd] = r["outcome"].startswith("ok") or "would need" in r["line"]
            log.append({"file": path.name, "cmd": cmd, **r})
            peak = max(peak, r.get("rss_mb", 0))
            if r["seconds"] > slowest[0]:
                slowest = (r["seconds"], f"{cmd} {path.name}")
            if r["outcome"].startswith(FAILED):
                failures.append(f"{cmd} {path.name}: {r['outcome']} {r['line']}")
            if r["outcome"].startswith(("hang", "worker died")):
                w.stop()
                w = Worker(args.memory_gb)
                break  # the commands of this file not yet run are not counted
    w.stop()
    wall = time.perf_counter() - t_start
    print(f"{len(files)} odd MIDI files through {', '.join(COMMANDS)} ({wall:.0f} s; bounds: {args.timeout:.0f} s "
          f"per command, {args.memory_gb:g} GB of address space; peak resident memory of a worker {peak} MB; "
          f"slowest {slowest[0]:.1f} s, {slowest[1]})")
    for cmd in COMMANDS:
        total = sum(counts[cmd].values())
        print(f"  {cmd:<15} {total:>4} files: " + ", ".join(f"{v} {k}" for k, v in sorted(counts[cmd].items(),
                                                                                          key=lambda kv: -kv[1])))
    # the reader policy is one: a file tokenize accepts, the others accept too, and the other way round
    readers = ("tokenize", "continue", "render", "show")
    differ = [f"{name}: " + ", ".join(f"{c} {'accepts' if a[c] else 'refuses'} it" for c in readers)
              for name, a in accepted.items() if len(a) == len(COMMANDS) and len({a[c] for c in readers}) > 1]
    failures += differ
    print(f"files that tokenize, continue, render and show read differently: {len(differ)}")
    if args.writers:
        failures += concurrent_writers(folder, args.writers)
    print(f"failures: {len(failures)}")
    for f in failures:
        print(f"  {f}")
    if args.keep is not None:
        (folder / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in log))
    else:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
