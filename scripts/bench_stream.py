"""Live-transcription benchmark: N concurrent real-time clients against ``audiofast serve``.

Per N (1, 2, 4, 8 by default), every client streams a real recording (the moonshine clips in
turn) at real-time pace over loopback. Reported per N:

- first partial: seconds from speech onset (silero VAD on the file) to the first ``partial``
- commit latency: seconds from a word's end (its time in the ``final`` event) to the arrival
  of that ``final``
- utterance final: seconds from the end of an utterance's speech (silero VAD on the file: the
  same reference for every engine, whatever times its finals carry) to the arrival of the
  utterance's last ``final``
- end lag: seconds from the last audio frame to ``closed`` (bounded = real time held)
- WER of the concatenated finals against the references, beside the offline transcript's
- server RSS (peak, from /proc) — the server runs as its own process
- host steal: the share of CPU time the VM's host took during the row (/proc/stat); rows
  with a large one are not comparable with the rest
- the decoder's work from the server's /health: tokens per decoder call (the previous
  hypothesis as a draft) and milliseconds of decoder time per decoded token, and the share
  of decode time spent in the encoder

Each ``--engines`` entry is a server of its own (``audiofast serve --engine E [--pad S]
[--encoder X] [--min-chunk C] [--precision P] [--probe-pad S] [--lead-in S]``, spelled ``E``,
``E+padS``, ``E+encX``, ``E+chunkC``, ``E+precP``, ``E+probeS``, ``E+leadS``), run side
by side in one invocation:
``ct2`` is the old engine (CTranslate2's generate), ``auto`` the fused int8 decoder with
drafts. ``--baseline DIR`` also runs each engine from another checkout of audiofast (a ``git
worktree`` of an older commit), labelled ``before/E``, right before this tree's: old and new
in one run.

    python scripts/bench_stream.py --models whisper-base whisper-tiny.en --clients 1 2 4 8 \
        --engines ct2 auto --baseline /tmp/old
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from audiofast.asr.runtime import load_model
from audiofast.audio import load_audio
from audiofast.eval.datasets import real_speech_clips
from audiofast.eval.wer import wer
from audiofast.stream.client import stream_audio
from audiofast.stream.vad import SAMPLE_RATE, SpeechDetector

OUT = Path(__file__).resolve().parents[1] / "evals" / "benchmarks"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def speech_ends(audio: np.ndarray) -> tuple[float, list[float]]:
    """Where speech first starts and where each stretch of it ends (seconds), per VAD."""
    detector = SpeechDetector()
    events = detector.feed(audio) + detector.flush()
    onset = next(e.sample for e in events if e.kind == "start") / SAMPLE_RATE
    return onset, [e.sample / SAMPLE_RATE for e in events if e.kind == "end"]


def nearest(values: list[float], x: float) -> float:
    return min(values, key=lambda v: abs(v - x))


def proc_memory_mb(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def start_server(model: str, port: int, threads: int, engine: str,
                 tree: Path | None = None) -> subprocess.Popen:
    """``engine``: ENGINE[+padSECONDS][+encENCODER][+chunkSECONDS][+precPRECISION]
    [+probeSECONDS][+leadSECONDS] (serve's --engine, --pad, --encoder, --min-chunk,
    --precision, --probe-pad and --lead-in);
    ``tree``: run the audiofast of that checkout instead of this one."""
    name, *parts = engine.split("+")
    flags = {"pad": "--pad", "enc": "--encoder", "chunk": "--min-chunk", "prec": "--precision",
             "probe": "--probe-pad", "lead": "--lead-in"}
    cmd = [sys.executable, "-m", "audiofast.cli", "serve", "--model", model, "--port",
           str(port), "--max-sessions", "16", "--threads", str(threads), "--engine", name,
           *(x for p in parts for key, flag in flags.items() if p.startswith(key)
             for x in (flag, p[len(key):]))]
    # ``-m`` puts the working directory first on sys.path: run in the tree that should serve
    env = {**os.environ, "PYTHONPATH": str(tree)} if tree else None
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env, cwd=tree)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start")


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


async def run_clients(url: str, clips: list, n: int) -> list[dict]:
    chosen = [clips[i % len(clips)] for i in range(n)]
    results = await asyncio.gather(*(stream_audio(url, c["audio"], speed=1.0, timeout=300)
                                     for c in chosen))
    rows = []
    for clip, result in zip(chosen, results, strict=True):
        partials = [t for t, e in result.events if e["type"] == "partial" and e["text"]]
        finals = [(t, e) for t, e in result.events if e["type"] == "final"]
        last_of_utt = {e["utterance"]: (t, e) for t, e in finals}
        closed = next(t for t, e in result.events if e["type"] == "closed")
        rows.append({
            "clip": clip["name"],
            "first_partial_s": (partials[0] - clip["onset"]) if partials else None,
            "commit_latency_s": [t - e["end"] for t, e in finals],
            "utterance_final_s": [t - nearest(clip["speech_ends"], e["end"])
                                  for t, e in last_of_utt.values()],
            "finals": [{"t": round(t, 3), **{k: e[k] for k in ("utterance", "start", "end")}}
                       for t, e in finals],
            "end_lag_s": closed - clip["duration"],
            "errors": len(result.errors),
            "text": result.text,
            "wer": wer(clip["reference"], result.text),
            "final_words": len(" ".join(e["text"] for _, e in finals).split()),
        })
    return rows


def cpu_times() -> list[int]:
    """This machine's CPU time counters (/proc/stat's first line: user ... steal); empty where
    there is no /proc."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return []


def steal_share(before: list[int], after: list[int]) -> float | None:
    """The share of CPU time the host took from this VM between two :func:`cpu_times`
    (field 8, steal): rows run with a large one are not comparable with the rest."""
    if len(before) < 8 or len(after) < 8:
        return None
    delta = [b - a for a, b in zip(before, after, strict=False)]
    return delta[7] / max(1, sum(delta[:8]))


def health(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
        return json.loads(response.read())


def summarize(model: str, engine: str, n: int, rows: list[dict], memory: dict,
              offline: dict[str, float], served: dict, steal: float | None = None) -> dict:
    commits = [x for r in rows for x in r["commit_latency_s"]]
    utt = [x for r in rows for x in r["utterance_final_s"]]
    first = [r["first_partial_s"] for r in rows if r["first_partial_s"] is not None]
    stats = served["decoder"]
    decode_s = stats["encoder_s"] + stats["decoder_s"]
    return {
        "model": model, "engine": engine.replace("auto", served["engine"], 1), "clients": n,
        "loop_retries": stats.get("full_window"),
        "first_partial_p50": percentile(first, 50), "first_partial_p95": percentile(first, 95),
        "commit_p50": percentile(commits, 50), "commit_p95": percentile(commits, 95),
        "utt_final_p50": percentile(utt, 50), "utt_final_p95": percentile(utt, 95),
        "end_lag_max": max(r["end_lag_s"] for r in rows),
        "realtime_held": max(r["end_lag_s"] for r in rows) < 3.0,
        "wer": float(np.mean([r["wer"] for r in rows])),
        "offline_wer": float(np.mean([offline[r["clip"]] for r in rows])),
        # streamed minus offline WER, worst clip (the goal: within 1 point on each)
        "wer_gap_max": max(r["wer"] - offline[r["clip"]] for r in rows),
        "tokens_per_call": stats["tokens"] / max(1, stats["decoder_calls"]),
        "decoder_ms_per_token": 1000 * stats["decoder_s"] / max(1, stats["tokens"]),
        "encoder_share": stats["encoder_s"] / decode_s if decode_s else float("nan"),
        # all decode work (encoder, decoder, alignment) per word the clients got as final
        "decode_ms_per_word": 1000 * (decode_s + stats.get("align_s", 0.0))
        / max(1, sum(r["final_words"] for r in rows)),
        "decoder_stats": stats,
        "errors": sum(r["errors"] for r in rows),
        "rss_peak_mb": memory.get("VmHWM"), "host_steal": steal, "rows": rows,
    }


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for key in dict.fromkeys((r["model"], r["engine"]) for r in results):
        rs = [r for r in results if (r["model"], r["engine"]) == key]
        ns = [r["clients"] for r in rs]
        label = "/".join(key)
        axes[0].plot(ns, [r["first_partial_p50"] for r in rs], "o-", label=f"{label} p50")
        axes[1].plot(ns, [r["utt_final_p95"] for r in rs], "o-", label=f"{label} p95")
    axes[0].set(title="first partial after speech onset", xlabel="concurrent clients",
                ylabel="seconds")
    axes[1].set(title="utterance final after its speech ends", xlabel="concurrent clients",
                ylabel="seconds")
    for ax in axes:
        ax.axhline(0.5 if ax is axes[0] else 1.0, color="grey", ls=":", label="goal")
        ax.set_xscale("log", base=2)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["whisper-base"])
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--engines", nargs="+", default=["ct2", "auto"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT / "bench_stream.json")
    parser.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                        help="also run each engine from this audiofast checkout (before/E)")
    args = parser.parse_args()
    clips = [{"name": c.name, "audio": load_audio(c.audio), "reference": c.reference}
             for c in real_speech_clips()]
    for c in clips:
        c["duration"] = len(c["audio"]) / SAMPLE_RATE
        c["onset"], c["speech_ends"] = speech_ends(c["audio"])
    results = []
    for model in args.models:
        runtime = load_model(model, threads=args.threads)
        offline = {c["name"]: wer(c["reference"], runtime.transcribe(c["audio"]).text)
                   for c in clips}
        del runtime
        for n in args.clients:
            runs = [(f"before/{e}", e, args.baseline) for e in args.engines] \
                if args.baseline else []
            runs = [r for e in args.engines for r in [*(x for x in runs if x[1] == e),
                                                      (e, e, None)]]
            for label, engine, tree in runs:  # side by side at each N: drift hits all alike
                port = free_port()
                server = start_server(model, port, args.threads, engine, tree)
                try:
                    times = cpu_times()
                    rows = asyncio.run(run_clients(f"ws://127.0.0.1:{port}/asr", clips, n))
                    steal = steal_share(times, cpu_times())
                    memory = proc_memory_mb(server.pid)
                    served = health(port)
                finally:
                    server.terminate()
                    server.wait(30)
                summary = summarize(model, label, n, rows, memory, offline, served, steal)
                results.append(summary)
                print(f"{model} {summary['engine']} N={n}: first partial p50 "
                      f"{summary['first_partial_p50']:.2f} s, utterance final p95 "
                      f"{summary['utt_final_p95']:.2f} s, end lag max "
                      f"{summary['end_lag_max']:.1f} s", flush=True)
    header = ("| model | engine | N | first partial p50/p95 s | commit p50/p95 s | utterance "
              "final p50/p95 s | end lag max s | real time | WER stream / offline (worst "
              "clip gap) | tokens/call | decoder ms/token | decode ms/final word | encoder "
              "share | RSS peak MB | host steal |")
    print("\n" + header + "\n|" + "---|" * 15)
    for r in results:
        print(f"| {r['model']} | {r['engine']} | {r['clients']} | {r['first_partial_p50']:.2f} / "
              f"{r['first_partial_p95']:.2f} | {r['commit_p50']:.2f} / {r['commit_p95']:.2f} | "
              f"{r['utt_final_p50']:.2f} / {r['utt_final_p95']:.2f} | {r['end_lag_max']:.1f} | "
              f"{'yes' if r['realtime_held'] else 'no'} | {r['wer']:.3f} / "
              f"{r['offline_wer']:.3f} ({r['wer_gap_max']:+.3f}) | {r['tokens_per_call']:.2f} | "
              f"{r['decoder_ms_per_token']:.1f} | {r['decode_ms_per_word']:.0f} | "
              f"{r['encoder_share']:.0%} | "
              f"{r['rss_peak_mb']:.0f} | "
              + ("-" if r["host_steal"] is None else f"{r['host_steal']:.0%}") + " |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"cpu_count": __import__("os").cpu_count(), "threads": args.threads}
    args.out.write_text(json.dumps({"machine": machine, "results": results}, indent=1))
    plot(results, args.out.with_suffix(".png"))
    print(f"\nwrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
