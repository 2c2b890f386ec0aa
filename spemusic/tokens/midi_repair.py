"""Byte repair of broken Standard MIDI Files, before symusic reads them: a file cut short is found
(:func:`truncation`), and tempo, time and key signature events shorter than their kind are
turned into events readers skip (:func:`skip_short_meta`). Used by
:func:`spemusic.tokens.file_policy.parse_midi_bytes`."""

from __future__ import annotations

import re


def truncation(data: bytes) -> str:
    """Why a Standard MIDI File is cut short, or "" if its chunks fit: one of the header's tracks
    missing, or a chunk that declares more bytes than remain (bytes after the last track are
    ignored, as players ignore them). symusic 0.5 reads such files leniently, as if the rest were
    silence."""
    if len(data) < 14:
        return "truncated header"
    tracks = int.from_bytes(data[10:12], "big")
    pos, found = 8 + int.from_bytes(data[4:8], "big"), 0
    while found < tracks:
        if pos + 8 > len(data):
            return f"truncated: {found} of its {tracks} tracks"
        kind, length = data[pos:pos + 4], int.from_bytes(data[pos + 4:pos + 8], "big")
        if pos + 8 + length > len(data):
            if not (kind.isascii() and kind.isalnum()):  # not a chunk name: a length before it is wrong
                return f"no chunk at byte {pos:,}, where track {found + 1} of {tracks} should begin: a length before it is wrong"
            return f"truncated: a {kind.decode('latin-1')!r} chunk declares {length:,} bytes, {len(data) - pos - 8:,} remain"
        found += kind == b"MTrk"
        pos += 8 + length
    return ""


# meta events symusic reads, and the bytes each holds: one declaring fewer is read on into the
# next events' bytes (a 1-byte tempo became 130 BPM, made up of the following note-on)
_META_SIZES = {0x51: ("tempo", 3), 0x58: ("time signature", 4), 0x59: ("key signature", 2)}
_SHORT_META = re.compile(rb"\xff\x51[\x00-\x02]|\xff\x58[\x00-\x03]|\xff\x59[\x00\x01]")


def _vlq(data: bytes, i: int, end: int) -> tuple[int, int]:
    """A variable-length quantity at data[i:end]: (value, index after it)."""
    value = 0
    for _ in range(4):
        if i >= end:
            break
        b = data[i]
        value, i = (value << 7) | (b & 0x7F), i + 1
        if b < 0x80:
            break
    return value, i


def skip_short_meta(data: bytes) -> tuple[bytes, list[str]]:
    """The file with each tempo, time or key signature shorter than its kind turned into a
    sequencer-specific event (which readers skip), and a sentence per kind. Only a file where
    such bytes may occur is walked event by event (a regular expression finds none in others)."""
    if not _SHORT_META.search(data):
        return data, []
    out, found = bytearray(data), {}
    pos, track = 8 + int.from_bytes(data[4:8], "big"), 0
    while pos + 8 <= len(data):
        kind, end = data[pos:pos + 4], min(len(data), pos + 8 + int.from_bytes(data[pos + 4:pos + 8], "big"))
        i, tick, status = pos + 8, 0, 0
        track += kind == b"MTrk"
        while kind == b"MTrk" and i < end:
            delta, i = _vlq(data, i, end)
            tick += delta
            if i >= end:
                break
            b = data[i]
            if b == 0xFF and i + 1 < end:  # meta: type, length, bytes
                length, j = _vlq(data, i + 2, end)
                what, size = _META_SIZES.get(data[i + 1], ("", 0))
                if length < size:
                    out[i + 1] = 0x7F
                    found.setdefault(what, []).append((tick, track, length, size))
                i = j + length
            elif b in (0xF0, 0xF7):  # system exclusive: length, bytes
                length, j = _vlq(data, i + 1, end)
                i = j + length
            elif b < 0xF0 and (b >= 0x80 or status):  # a channel message, or its running status
                status, i = (b, i + 1) if b >= 0x80 else (status, i)
                i += 1 if status >> 4 in (0xC, 0xD) else 2
            else:  # bytes no reader can follow: leave the rest of this track to symusic
                break
        pos += 8 + int.from_bytes(data[pos + 4:pos + 8], "big")
    notes = []
    for what, events in found.items():
        tick, track, length, size = events[0]
        more = f" (and {len(events) - 1} more)" if len(events) > 1 else ""
        notes.append(f"a {what} event of {length} byte{'s' * (length != 1)} (it needs {size}) at tick {tick} of "
                     f"track {track} is skipped{more}")
    return bytes(out), notes
