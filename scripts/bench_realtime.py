"""OpenAI Realtime transcription on ``serve --http-port`` against the offline transcript: the
``openai`` SDK's realtime client streams each real recording (24 kHz PCM16, 100 ms appends,
paced at ``--speed`` x real time, 0: as fast as it can) and the items' completed transcripts
are scored beside ``transcribe``'s.

    python scripts/bench_realtime.py --speed 1 --out evals/benchmarks/X

Prints a markdown table (WER per clip, server VAD and manual commit, offline; seconds from the
last append to the last ``completed``) and writes it with a JSON beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
from pathlib import Path

import numpy as np
import soxr
from openai import AsyncOpenAI

from audiofast.asr.options import TranscribeOptions
from audiofast.asr.runtime import load_model
from audiofast.audio import load_audio
from audiofast.eval.datasets import real_speech_clips
from audiofast.eval.wer import wer
from audiofast.stream.server import ServerOptions, ServerThread

COMPLETED = "conversation.item.input_audio_transcription.completed"


async def realtime_text(url: str, audio: np.ndarray, vad: bool, speed: float
                        ) -> tuple[str, float]:
    """The joined completed transcripts, and seconds from the last append to the last one."""
    pcm = soxr.resample(np.concatenate([audio, np.zeros(32000, np.float32)]), 16000, 24000)
    pcm = (np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes()
    client = AsyncOpenAI(base_url=url, api_key="none", max_retries=0)
    events, times = [], []
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:

        async def read() -> None:  # all along, as a live client does (an unread socket stalls
            async for event in conn:  # the client's own keepalive pings)
                events.append(event)
                times.append(time.perf_counter())

        reader = asyncio.create_task(read())
        await conn.session.update(session={"type": "transcription", "audio": {"input": {
            "transcription": {"model": "whisper-1", "language": "en"},
            "turn_detection": {"type": "server_vad"} if vad else None}}})
        for i in range(0, len(pcm), 4800):
            await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i:i + 4800]).decode())
            if speed > 0:
                await asyncio.sleep(0.1 / speed)
        if not vad:
            await conn.input_audio_buffer.commit()
        sent = time.perf_counter()
        while time.perf_counter() - sent < 120:  # until every item completed, then 3 s quiet
            await asyncio.sleep(0.1)
            kinds = [e.type for e in events]
            settled = kinds.count("input_audio_buffer.committed") == kinds.count(COMPLETED) > 0
            if settled and time.perf_counter() - max(times[-1], sent) > 3.0:
                break
        reader.cancel()
    done = [t for e, t in zip(events, times, strict=True) if e.type == COMPLETED]
    last = max(done) - sent if done else float("nan")
    return " ".join(e.transcript for e in events if e.type == COMPLETED), last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="whisper-base")
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    runtime = load_model(args.model, threads=args.threads)
    rows = []
    thread = ServerThread(runtime, ServerOptions(port=0, http_port=0))
    with thread:
        for clip in real_speech_clips():
            audio = load_audio(clip.audio)
            offline = runtime.transcribe(audio, TranscribeOptions(language="en")).text
            vad_text, vad_s = asyncio.run(realtime_text(thread.api_url, audio, True, args.speed))
            manual_text, manual_s = asyncio.run(realtime_text(thread.api_url, audio, False,
                                                              args.speed))
            rows.append({"clip": clip.name, "seconds": round(len(audio) / 16000, 2),
                         "wer_server_vad": round(wer(clip.reference, vad_text), 4),
                         "wer_manual": round(wer(clip.reference, manual_text), 4),
                         "wer_offline": round(wer(clip.reference, offline), 4),
                         "last_completed_s_vad": round(vad_s, 2),
                         "last_completed_s_manual": round(manual_s, 2),
                         "server_vad_text": vad_text})
            print(rows[-1], flush=True)
    refs = [c.reference for c in real_speech_clips()]
    joined = wer(refs, [r["server_vad_text"] for r in rows])
    lines = ["| clip | s | WER server VAD % | WER manual commit % | WER offline % | last "
             "completed after the last append, s (VAD / manual) |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['clip']} | {r['seconds']} | {100 * r['wer_server_vad']:.1f} | "
              f"{100 * r['wer_manual']:.1f} | {100 * r['wer_offline']:.1f} | "
              f"{r['last_completed_s_vad']:.2f} / {r['last_completed_s_manual']:.2f} |"
              for r in rows]
    text = "\n".join(lines) + f"\n\nServer VAD, the four joined: {100 * joined:.1f} %"
    print(text)
    if args.out is not None:
        args.out.with_suffix(".json").write_text(json.dumps(
            {"model": args.model, "speed": args.speed, "rows": rows}, indent=1))
        args.out.with_suffix(".md").write_text(
            f"# OpenAI Realtime transcription vs offline\n\n`python scripts/bench_realtime.py "
            f"--model {args.model} --speed {args.speed:g}`, {args.threads} threads.\n\n{text}\n")


if __name__ == "__main__":
    main()
