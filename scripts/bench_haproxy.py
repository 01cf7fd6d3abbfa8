"""Live scale-out on loopback: two ``audiofast serve`` replicas behind HAProxy
(configs/haproxy/audiofast.cfg, unchanged but for its address variables), one killed mid-session.

    python scripts/bench_haproxy.py --model whisper-tiny.en --rounds 2 --out evals/benchmarks/X

One round: r1 takes 2 sessions (``--max-sessions 2``), r2 takes 4. Five sessions open through
HAProxy: where each lands (HAProxy's ``X-Audiofast-Replica`` header and each replica's
``/metrics``), whether HAProxy shows the full r1 as DRAIN (its agent check) and so sends the
fifth to r2. r1's sessions finish their clip; then r2 is killed (SIGKILL) while its three
stream: each of their clients must see the connection close, four new sessions (two at once,
r1's capacity, twice) must all reach r1 and transcribe, and HAProxy's time to mark r2 DOWN is
taken. Last, with r1 full and r2 gone, one more session must be refused in its handshake (503).
tests/test_haproxy.py runs one round and asserts on it.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from websockets.exceptions import ConnectionClosed, InvalidStatus

from audiofast.audio import load_audio
from audiofast.eval.datasets import real_speech_clips
from audiofast.eval.wer import wer
from audiofast.stream.client import StreamClient

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "haproxy" / "audiofast.cfg"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def haproxy_binary() -> str:
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.access(
        "/usr/sbin/haproxy", os.X_OK) else None)
    if found is None:
        raise SystemExit("haproxy is missing: run scripts/setup.sh")
    return found


def wait_for(what: str, ready, timeout: float = 120.0, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: exited with {proc.returncode}")
        try:
            value = ready()
            if value:
                return value
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not ready after {timeout:.0f} s")


class Fleet:
    """Replicas r1, r2 (``serve`` processes) and HAProxy in front, on free loopback ports."""

    def __init__(self, model: str, max_sessions: dict[str, int], stack: ExitStack) -> None:
        self.ports = {name: (free_port(), free_port()) for name in max_sessions}
        self.front, self.stats_port = free_port(), free_port()
        self.replicas: dict[str, subprocess.Popen] = {}
        for name, (port, agent) in self.ports.items():
            proc = subprocess.Popen(
                [sys.executable, "-m", "audiofast.cli", "serve", "--model", model, "--port",
                 str(port), "--agent-port", str(agent), "--max-sessions",
                 str(max_sessions[name]), "--threads", "1"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            stack.callback(_stop, proc)
            self.replicas[name] = proc
        for name, proc in self.replicas.items():
            wait_for(f"replica {name}", lambda name=name: self.metrics(name) is not None,
                     proc=proc)
        env = {**os.environ, "AUDIOFAST_BIND": f"127.0.0.1:{self.front}",
               "AUDIOFAST_STATS": f"127.0.0.1:{self.stats_port}"}
        for name, (port, agent) in self.ports.items():
            env[f"AUDIOFAST_{name.upper()}"] = f"127.0.0.1:{port}"
            env[f"AUDIOFAST_{name.upper()}_AGENT"] = str(agent)
        self.haproxy = subprocess.Popen([haproxy_binary(), "-db", "-f", str(CONFIG)], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        stack.callback(_stop, self.haproxy)
        wait_for("haproxy", lambda: all(self.status(n).startswith("UP") for n in self.ports),
                 timeout=30, proc=self.haproxy)
        self.url = f"ws://127.0.0.1:{self.front}/asr"

    def metrics(self, name: str) -> dict[str, float] | None:
        """The replica's /metrics samples by name; None if it does not answer."""
        try:
            url = f"http://127.0.0.1:{self.ports[name][0]}/metrics"
            with urllib.request.urlopen(url, timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return None
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                if line and not line.startswith("#")}

    def status(self, name: str) -> str:
        """HAProxy's status of one replica: UP, DRAIN, DOWN, 'UP 1/2'..."""
        url = f"http://127.0.0.1:{self.stats_port}/stats;csv"
        with urllib.request.urlopen(url, timeout=2) as response:
            rows = csv.DictReader(io.StringIO(response.read().decode().lstrip("# ")))
            return next(r["status"] for r in rows if r["pxname"] == "replicas"
                        and r["svname"] == name)

    def kill(self, name: str) -> None:
        self.replicas[name].send_signal(signal.SIGKILL)
        self.replicas[name].wait()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _send(client: StreamClient, audio, speed: float) -> None:
    """``audio`` in 0.1 s frames at ``speed`` x real time (0: as fast as the socket takes)."""
    for i, start in enumerate(range(0, len(audio), 1600)):
        await client.send(audio[start:start + 1600])
        if speed:
            await asyncio.sleep(max(0.0, client.t0 + (i + 1) * 0.1 / speed - time.perf_counter()))


async def _open(url: str) -> tuple[StreamClient, str]:
    client = StreamClient(url)
    await client.__aenter__()
    return client, client.ws.response.headers.get("X-Audiofast-Replica")


async def _speak(client: StreamClient, clip, audio, speed: float) -> dict:
    """Stream one clip on an open session to its end; what the client saw."""
    try:
        await _send(client, audio, speed)
        result = await client.end(120)
        return {"text": result.text, "closed": result.closed, "dropped": None,
                "wer": wer([clip.reference], [result.text])}
    except (ConnectionClosed, TimeoutError) as err:
        return {"text": client.result.text, "closed": client.result.closed,
                "dropped": type(err).__name__}
    finally:
        await client.__aexit__(None, None, None)


def _sessions(fleet: Fleet) -> dict[str, int]:
    return {n: int((fleet.metrics(n) or {}).get("audiofast_sessions", 0)) for n in fleet.ports}


async def _until_free(fleet: Fleet, name: str) -> None:
    """Until the replica has no session open and HAProxy has seen its agent say ready."""
    await asyncio.to_thread(wait_for, f"{name} free", lambda: fleet.status(name).startswith(
        "UP") and _sessions(fleet)[name] == 0, 10)


async def _round(fleet: Fleet, clips: dict) -> dict:
    short, long_ = clips["clone-test"], clips["endgame_nagg_nell"]
    audio = {c.name: load_audio(c.audio) for c in (short, long_)}
    # Four sessions: leastconn puts two on each; r1 (--max-sessions 2) is then full, and its
    # agent says drain, so the fifth goes to r2.
    first = [await _open(fleet.url) for _ in range(4)]
    r1_status = await asyncio.to_thread(
        wait_for, "r1 drained", lambda: (s := fleet.status("r1")).startswith("DRAIN") and s, 5)
    first.append(await _open(fleet.url))
    split = await asyncio.to_thread(
        wait_for, "sessions counted", lambda: sum((m := _sessions(fleet)).values()) == 5 and m,
        10)
    tasks = [asyncio.create_task(_speak(c, short if r == "r1" else long_,
                                        audio[short.name if r == "r1" else long_.name], 1.0))
             for c, r in first]
    # r1's short clips end; r2's long ones are mid-utterance when r2 is killed.
    await asyncio.gather(*(t for t, (_, r) in zip(tasks, first, strict=True) if r == "r1"))
    await _until_free(fleet, "r1")
    await asyncio.to_thread(fleet.kill, "r2")
    killed = time.perf_counter()

    async def new_session() -> dict:
        try:
            client, replica = await _open(fleet.url)
        except (OSError, InvalidStatus) as err:
            return {"replica": None, "error": str(err)}
        return {"replica": replica, "error": None,
                **await _speak(client, short, audio[short.name], 0)}

    fresh = list(await asyncio.gather(new_session(), new_session()))  # r1's capacity, at once
    await _until_free(fleet, "r1")  # a full r1 drains: a session opened now would get 503
    fresh += await asyncio.gather(new_session(), new_session())
    down_s = await asyncio.to_thread(wait_for, "r2 down", lambda: fleet.status("r2").startswith(
        "DOWN") and time.perf_counter() - killed, 30)
    killed_sessions = await asyncio.gather(*tasks)
    # The fleet full (r1's two slots held, r2 gone): a sixth session is refused in its
    # handshake, 503 from HAProxy; it never opens to be dropped.
    await _until_free(fleet, "r1")
    held = [await _open(fleet.url) for _ in range(2)]
    await asyncio.to_thread(wait_for, "r1 drained", lambda: fleet.status("r1").startswith(
        "DRAIN"), 5)
    try:
        extra, _ = await _open(fleet.url)
        await extra.__aexit__(None, None, None)
        refused = None
    except InvalidStatus as err:
        refused = err.response.status_code
    for client, _ in held:
        await client.__aexit__(None, None, None)
    return {
        "landed": [r for _, r in first], "open_sessions": split,
        "r1_status_when_full": r1_status,
        "first_sessions": [{"replica": r, **s} for (_, r), s in
                           zip(first, killed_sessions, strict=True)],
        "r2_down_after_s": round(down_s, 2), "new_sessions": fresh,
        "full_fleet_handshake_status": refused,
    }


def run_round(model: str, clips: dict | None = None) -> dict:
    clips = clips or {c.name: c for c in real_speech_clips()}
    with ExitStack() as stack:
        fleet = Fleet(model, {"r1": 2, "r2": 4}, stack)
        return asyncio.run(_round(fleet, clips))


def summary_row(result: dict) -> dict:
    first = result["first_sessions"]
    fresh = result["new_sessions"]
    return {
        "split": f"r1 {result['open_sessions']['r1']} / r2 {result['open_sessions']['r2']}",
        "r1_when_full": result["r1_status_when_full"],
        "killed_sessions_dropped_visibly": sum(s["replica"] == "r2" and s["dropped"] is not None
                                               for s in first),
        "full_fleet_handshake": result["full_fleet_handshake_status"],
        "killed_sessions": sum(s["replica"] == "r2" for s in first),
        "survivor_wer": [round(s["wer"], 3) for s in first if s["replica"] == "r1"],
        "new_ok": sum(s["error"] is None and s["replica"] == "r1" for s in fresh),
        "new_total": len(fresh),
        "new_wer_max": round(max((s.get("wer", 1.0) for s in fresh), default=0.0), 3),
        "r2_down_after_s": result["r2_down_after_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="whisper-tiny.en")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = [run_round(args.model) for _ in range(args.rounds)]
    rows = [summary_row(r) for r in results]
    lines = ["| round | sessions open (split) | r1 full: HAProxy says | r2 sessions that saw the "
             "kill | r1 session WER | new sessions after kill: ok on r1 | their max WER | r2 "
             "DOWN after s | full fleet: handshake |", "|" + "---|" * 9]
    lines += [f"| {i + 1} | {r['split']} | {r['r1_when_full']} | "
              f"{r['killed_sessions_dropped_visibly']}/{r['killed_sessions']} | "
              f"{r['survivor_wer']} | {r['new_ok']}/{r['new_total']} | {r['new_wer_max']} | "
              f"{r['r2_down_after_s']:.2f} | {r['full_fleet_handshake']} |"
              for i, r in enumerate(rows)]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(
            {"machine": platform.processor() or platform.machine(), "model": args.model,
             "haproxy": subprocess.run([haproxy_binary(), "-v"], capture_output=True,
                                       text=True).stdout.splitlines()[0],
             "rows": rows, "rounds": results}, indent=1))
        args.out.with_suffix(".md").write_text(
            f"# Two replicas behind HAProxy, one killed\n\n`python scripts/bench_haproxy.py "
            f"--model {args.model} --rounds {args.rounds}` (configs/haproxy/audiofast.cfg; "
            "r1 --max-sessions 2, r2 --max-sessions 4, one thread each).\n\n"
            f"{text}\n")


if __name__ == "__main__":
    main()
