"""Soak test: more live sessions than the machine can decode in real time, for minutes.

``--clients`` clients (16) stream real speech (the four clips, looped) at real-time pace for
``--seconds`` (300) against one ``audiofast serve --max-sessions 16`` process. A healthy
server under overload does not crash, does not grow without bound, and never drops a session
silently: every client either gets all its finals (``closed`` after its ``end``) or an explicit
``overloaded`` error. The server's RSS is sampled every 5 s from /proc.

    python scripts/soak_stream.py --model whisper-base --clients 16 --seconds 300

Prints a table and writes JSON (and a PNG of RSS over time) beside ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
from bench_stream import free_port, health, proc_memory_mb, start_server

from audiofast.audio import SAMPLE_RATE, load_audio
from audiofast.eval.datasets import real_speech_clips
from audiofast.stream.client import stream_audio


def outcome(result) -> str:
    """complete (closed after the end message), overloaded (told so), or lost (anything else:
    the failure this test exists to catch)."""
    codes = [e.get("code") for e in result.errors]
    if result.closed and not codes:
        return "complete"
    if "overloaded" in codes:
        return "overloaded"
    return "lost: " + ",".join(str(c) for c in codes)


async def soak(url: str, audio: np.ndarray, clients: int, seconds: float, pid: int,
               rss: list[tuple[float, float]]) -> list[dict]:
    t0 = time.perf_counter()

    async def sample() -> None:
        while True:
            rss.append((time.perf_counter() - t0, proc_memory_mb(pid)["VmRSS"]))
            await asyncio.sleep(5)

    async def client(i: int) -> dict:
        await asyncio.sleep(0.25 * i)  # staggered starts, as real users arrive
        offset = int(i * 7.3 * SAMPLE_RATE) % len(audio)
        mine = np.roll(audio, -offset)[: int(seconds * SAMPLE_RATE)]
        try:
            result = await stream_audio(url, mine, 1.0, timeout=600, until_closed=True)
        except Exception as e:  # noqa: BLE001 - a soak records every way a client can fail
            return {"client": i, "outcome": f"lost: {type(e).__name__}: {e}"[:120],
                    "finals": 0, "words": 0}
        return {"client": i, "outcome": outcome(result), "finals": len(result.finals),
                "words": len(result.text.split()),
                "seconds_streamed": max((t for t, _ in result.events), default=0.0)}

    sampler = asyncio.create_task(sample())
    rows = await asyncio.gather(*(client(i) for i in range(clients)))
    sampler.cancel()
    return list(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="whisper-base")
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/soak_stream.json"))
    args = parser.parse_args()
    clips = [load_audio(c.audio) for c in real_speech_clips()]
    audio = np.concatenate(clips * int(np.ceil(args.seconds * SAMPLE_RATE / sum(map(len, clips)))))
    port = free_port()
    server = start_server(args.model, port, args.threads, args.engine)
    rss: list[tuple[float, float]] = []
    try:
        rows = asyncio.run(soak(f"ws://127.0.0.1:{port}/asr", audio, args.clients,
                                args.seconds, server.pid, rss))
        alive = server.poll() is None
        served = health(port) if alive else {}
        memory = proc_memory_mb(server.pid) if alive else {}
    finally:
        server.terminate()
        server.wait(30)
    counts = Counter(r["outcome"].split(":")[0] for r in rows)
    half = len(rss) // 2
    first, second = max(m for _, m in rss[:half]), max(m for _, m in rss[half:])
    summary = {"model": args.model, "engine": args.engine, "clients": args.clients,
               "seconds": args.seconds, "server_alive": alive, "outcomes": dict(counts),
               "rss_peak_mb": memory.get("VmHWM"), "rss_first_half_max_mb": first,
               "rss_second_half_max_mb": second, "health": served, "clients_rows": rows,
               "rss": rss}
    lines = [f"{args.clients} clients x {args.seconds:.0f} s of real speech at real time, "
             f"{args.model} ({args.engine}), --max-sessions 16, {args.threads} threads.", "",
             "| server alive | complete | overloaded | lost | finals (complete clients) | "
             "RSS max 1st half / 2nd half MB | RSS peak MB |", "|---|---|---|---|---|---|---|",
             f"| {'yes' if alive else 'NO'} | {counts['complete']} | {counts['overloaded']} | "
             f"{counts['lost']} | {sum(r['finals'] for r in rows if r['outcome'] == 'complete')}"
             f" | {first:.0f} / {second:.0f} | {memory.get('VmHWM', float('nan')):.0f} |"]
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1))
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([t for t, _ in rss], [m for _, m in rss])
    ax.set(xlabel="seconds", ylabel="server RSS (MB)", title="soak: server memory")
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=120)
    if not alive or counts["lost"]:
        raise SystemExit("soak FAILED: " + ("server died" if not alive else
                                            f"{counts['lost']} sessions lost"))


if __name__ == "__main__":
    main()
