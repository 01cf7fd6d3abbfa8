"""Accept or reject a candidate against its baseline, with no human in the loop.

Thresholds come from a YAML file (``configs/gates.yaml``); the verdict is an exit code, a
JSON report and a short markdown report. Sweeps and distillation stages call ``gate_asr`` /
``gate_audio`` directly.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from audiofast.eval import fad as fad_mod
from audiofast.eval.datasets import tts_texts
from audiofast.eval.roundtrip import roundtrip
from audiofast.resources import data_file, data_root

DEFAULT_CONFIG = data_file("configs/gates.yaml")


@dataclass
class Verdict:
    lane: str
    candidate: str
    baseline: str
    passed: bool
    checks: list[dict] = field(default_factory=list)  # name, value, limit, passed
    details: dict = field(default_factory=dict)
    seconds: float = 0.0

    def check(self, name: str, value: float | bool, limit: float | bool, passed: bool) -> None:
        self.checks.append({"name": name, "value": value, "limit": limit, "passed": passed})

    def markdown(self) -> str:
        head = "PASS" if self.passed else "FAIL"
        lines = [f"# Gate ({self.lane}): {head}", "",
                 f"candidate `{self.candidate}` vs baseline `{self.baseline}` "
                 f"({self.seconds:.1f} s)", "", "| check | value | limit | |", "|---|---|---|---|"]
        for c in self.checks:
            value = c["value"] if isinstance(c["value"], bool) else f"{c['value']:+.4f}"
            lines.append(f"| {c['name']} | {value} | {c['limit']} | "
                         f"{'ok' if c['passed'] else 'FAIL'} |")
        return "\n".join(lines) + "\n"

    def write(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "gate.json").write_text(json.dumps(self.__dict__, indent=2, default=float))
        (out_dir / "gate.md").write_text(self.markdown())


class GateConfigError(ValueError):
    """A gate config with an unknown key or a wrong type; one line naming it."""


# The keys a gate config may hold, with their types (a typo must not silently fall back).
GATE_KEYS: dict[str, dict[str, tuple[type, ...]]] = {
    "asr": {"texts": (str,), "voices": (list,), "augmentation": (str, type(None)),
            "max_tts_wer_delta": (int, float), "max_tts_ci_high": (int, float),
            "max_real_wer_delta": (int, float), "fail_on_anchor_conflict": (bool,),
            "limits_for_sentences": (int,)},
    "audio": {"embedder": (str,), "max_fad_ratio": (int, float)},
}


def load_config(path: Path | None = None) -> dict:
    """The gate thresholds (``configs/gates.yaml`` by default), checked against GATE_KEYS."""
    path = path or DEFAULT_CONFIG
    config = yaml.safe_load(Path(path).read_text())
    if not isinstance(config, dict):
        raise GateConfigError(f"{path}: want a mapping with asr: and audio: sections")
    for lane, section in config.items():
        if lane not in GATE_KEYS or not isinstance(section, dict):
            raise GateConfigError(f"{path}: {lane}: unknown section (known: asr, audio)")
        for key, value in section.items():
            types = GATE_KEYS[lane].get(key)
            if types is None:
                raise GateConfigError(f"{path}: {lane}.{key}: unknown key "
                                      f"(known: {', '.join(GATE_KEYS[lane])})")
            if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
                raise GateConfigError(f"{path}: {lane}.{key}={value!r}: expected "
                                      f"{' or '.join(t.__name__ for t in types)}")
    return config


def gate_texts(config: dict) -> list[str]:
    """The sentences of the ASR gate's round trip (``asr.texts`` of the config)."""
    texts_path = config["asr"].get("texts")
    if texts_path and not Path(texts_path).is_absolute():
        texts_path = data_root() / texts_path
    return tts_texts(texts_path)


def limit_scale(cfg: dict, sentences: int) -> float:
    """How much wider the TTS limits are on ``sentences`` sentences than on the set they were
    measured for (``limits_for_sentences``): the null spread of a WER delta shrinks as
    1/sqrt(n), so sqrt(n_ref / n) keeps an equivalent candidate's chance of failing the same
    on a sweep's half set as on the full one (evals/gate_floor.md)."""
    reference = cfg.get("limits_for_sentences")
    return math.sqrt(reference / sentences) if reference and sentences else 1.0


def gate_asr(candidate: str, baseline: str, config: dict, threads: int = 0,
             texts: list[str] | None = None, anchors: bool = True) -> Verdict:
    """``texts`` (default: the config's sentences) and ``anchors=False`` (no real recordings,
    so no real-speech checks) let a sweep select on one half of the sentences and confirm on
    the other half plus the recordings (audiofast/sweep/split.py)."""
    start = time.perf_counter()
    cfg = config["asr"]
    texts = gate_texts(config) if texts is None else texts
    report = roundtrip(candidate, baseline, texts, tuple(cfg["voices"]),
                       cfg.get("augmentation"), anchors=anchors, threads=threads)
    delta = report["delta"]
    verdict = Verdict("asr", candidate, baseline, passed=False, details=report)
    tts = delta["tts"]
    scale = limit_scale(cfg, len(texts))
    max_delta = round(cfg["max_tts_wer_delta"] * scale, 5)
    max_ci_high = round(cfg["max_tts_ci_high"] * scale, 5)
    verdict.check("tts_wer_delta", tts["delta"], max_delta, tts["delta"] <= max_delta)
    verdict.check("tts_wer_delta_ci_high", tts["ci_high"], max_ci_high,
                  tts["ci_high"] <= max_ci_high)
    if anchors:
        real = delta["real"]
        verdict.check("real_wer_delta", real["delta"], cfg["max_real_wer_delta"],
                      real["delta"] <= cfg["max_real_wer_delta"])
    if anchors and cfg.get("fail_on_anchor_conflict", True):
        verdict.check("anchor_conflict", delta["anchor_conflict"], False,
                      not delta["anchor_conflict"])
    verdict.passed = all(c["passed"] for c in verdict.checks)
    verdict.seconds = time.perf_counter() - start
    return verdict


def gate_audio(candidate: Path, baseline: Path, reference: Path, config: dict,
               stats_name: str | None = None) -> Verdict:
    """Candidate audio may be at most ``max_fad_ratio`` times further from the reference."""
    start = time.perf_counter()
    cfg = config["audio"]
    embedder = fad_mod.get_embedder(cfg["embedder"])
    cand = fad_mod.fad(candidate, reference, embedder, stats_name)
    base = fad_mod.fad(baseline, reference, embedder, stats_name)
    ratio = cand.fad / max(base.fad, 1e-12)
    verdict = Verdict("audio", str(candidate), str(baseline), passed=False,
                      details={"candidate": cand.__dict__, "baseline": base.__dict__})
    verdict.check("fad_ratio", ratio, cfg["max_fad_ratio"], ratio <= cfg["max_fad_ratio"])
    verdict.passed = all(c["passed"] for c in verdict.checks)
    verdict.seconds = time.perf_counter() - start
    return verdict
