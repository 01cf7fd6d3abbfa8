"""Transcript files: txt, srt, vtt, json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from audiofast.asr.types import Transcription

FORMATS = ("txt", "srt", "vtt", "json")


def format_timestamp(seconds: float, decimal_marker: str = ".", always_hours: bool = False) -> str:
    """``[HH:]MM:SS.mmm`` (SubRip uses a comma as the decimal marker)."""
    if seconds < 0:
        raise ValueError(f"negative timestamp {seconds}")
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    head = f"{hours:02d}:" if always_hours or hours else ""
    return f"{head}{minutes:02d}:{secs:02d}{decimal_marker}{millis:03d}"


def to_txt(result: Transcription) -> str:
    return "".join(f"{s.text.strip()}\n" for s in result.segments)


def cues(result: Transcription) -> list[tuple[float, float, str]]:
    """Subtitle cues: one per word where words are timed (``word_timestamps``), else one per
    segment."""
    out = []
    for s in result.segments:
        if s.words:
            out += [(w.start, w.end, w.word.strip()) for w in s.words]
        else:
            out.append((s.start, s.end, s.text.strip()))
    return out


def to_srt(result: Transcription) -> str:
    blocks = []
    for i, (start, end, text) in enumerate(cues(result), start=1):
        blocks.append(f"{i}\n{format_timestamp(start, ',', always_hours=True)} --> "
                      f"{format_timestamp(end, ',', always_hours=True)}\n{text}\n")
    return "\n".join(blocks)


def to_vtt(result: Transcription) -> str:
    return "WEBVTT\n\n" + "\n".join(
        f"{format_timestamp(start)} --> {format_timestamp(end)}\n{text}\n"
        for start, end, text in cues(result))


def to_json(result: Transcription) -> str:
    return json.dumps(result.to_dict(), indent=2, ensure_ascii=False) + "\n"


WRITERS: dict[str, Callable[[Transcription], str]] = {
    "txt": to_txt, "srt": to_srt, "vtt": to_vtt, "json": to_json,
}


def write_transcript(result: Transcription, audio_path: Path, fmt: str, output_dir: Path) -> Path:
    """Write ``<output_dir>/<audio stem>.<fmt>`` atomically; return its path."""
    if fmt not in WRITERS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    output_dir.mkdir(parents=True, exist_ok=True)
    target = output_dir / f"{audio_path.stem}.{fmt}"
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(WRITERS[fmt](result), encoding="utf-8")
    tmp.replace(target)
    return target
