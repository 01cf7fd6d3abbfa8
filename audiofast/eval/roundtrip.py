"""Label-free ASR scoring: text -> TTS audio -> the ASR under test -> WER against the text.

Absolute TTS WER says little (synthetic voices cause false alarms); what the judge trusts is
the *change* against a baseline on the identical audio, with a paired bootstrap confidence
interval, and the same change on real recordings (the anchor set) beside it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import jiwer
import numpy as np
from tqdm import tqdm

from audiofast.asr.options import TranscribeOptions
from audiofast.audio import SAMPLE_RATE, load_audio
from audiofast.cache import cache_dir
from audiofast.eval import augment
from audiofast.eval.datasets import real_speech_clips, tts_texts
from audiofast.eval.tts import DEFAULT_VOICES, synthesize
from audiofast.eval.wer import normalize


@dataclass
class Utterance:
    set: str  # "tts" or "real"
    voice: str  # TTS voice spec, or "human"
    item: str  # text index (a TTS pack: its texts' indices joined by "+") or clip name
    reference: str
    hypothesis: str
    errors: int  # substitutions + deletions + insertions, after normalisation
    words: int  # reference words, after normalisation


def count_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    ref, hyp = normalize(reference), normalize(hypothesis)
    if not ref:
        raise ValueError("empty reference after normalisation")
    out = jiwer.process_words(ref, hyp)
    return out.substitutions + out.deletions + out.insertions, len(ref.split())


def corpus_wer(utterances: list[Utterance]) -> float:
    return sum(u.errors for u in utterances) / max(1, sum(u.words for u in utterances))


def bootstrap_delta(
    candidate: list[Utterance], baseline: list[Utterance], resamples: int = 2000,
    seed: int = 0, confidence: float = 0.95,
) -> tuple[float, float, float]:
    """WER(candidate) - WER(baseline) and its paired-bootstrap interval over utterances."""
    if [(u.voice, u.item) for u in candidate] != [(u.voice, u.item) for u in baseline]:
        raise ValueError("candidate and baseline must be scored on the same utterances")
    err_c = np.array([u.errors for u in candidate], dtype=np.float64)
    err_b = np.array([u.errors for u in baseline], dtype=np.float64)
    words = np.array([u.words for u in candidate], dtype=np.float64)
    delta = (err_c.sum() - err_b.sum()) / words.sum()
    idx = np.random.default_rng(seed).integers(0, len(words), size=(resamples, len(words)))
    deltas = (err_c[idx].sum(1) - err_b[idx].sum(1)) / words[idx].sum(1)
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(deltas, [tail, 100 - tail])
    return float(delta), float(lo), float(hi)


# The judge decodes greedily with no temperature fallback: sampling would make two runs of
# the same candidate disagree, and a verdict must be reproducible. Its windows are Whisper's
# own (30 s, no pad) unless a spec says "+padN": its baselines, caches and gate limits were
# measured so, whatever the library's defaults become.
JUDGE_OPTIONS = TranscribeOptions(temperatures=(0.0,), window_pad=None, chunk_length=30.0)


SPEC_OPTIONS = {"pad": "window_pad", "batch": "batch_size", "chunk": "chunk_length",
                "beam": "beam_size"}
INT_OPTIONS = ("batch", "beam")
ENCODERS = {"ov": "openvino", "auto": "auto", "fenc": "fused"}  # +ov, +auto, +fenc


@dataclass(frozen=True)
class ASRSpec:
    engine: str  # "ct2" or "fast" (the owned decoder engine)
    model: str
    compute_type: str | None  # CTranslate2's, or the fast engine's precision (None: the model's)
    encoder: str  # "ct2", "openvino" or "auto"
    options: dict[str, float]  # TranscribeOptions overrides


def parse_asr_spec(spec: str) -> ASRSpec:
    """``[fast:]MODEL[@COMPUTE][+ov|+auto][+padN][+batchN][+chunkN][+beamN]`` -> :class:`ASRSpec`.

    ``fast:`` decodes on the owned engine (compute type = its precision); ``+ov`` encodes on
    OpenVINO, ``+auto`` on OpenVINO for long windows only; ``+padN`` encodes short windows as
    audio + N s instead of 30 s; ``+batchN+chunkS`` transcribes chunks of at most S seconds
    side by side, N at a time (batched.py); ``+beamN`` decodes with N beams (CTranslate2).
    So the judge gates decoding configurations, not only weights: ``whisper-base+auto+pad10``."""
    engine, _, rest = spec.rpartition(":")
    if engine not in ("", "fast"):
        raise ValueError(f"unknown engine {engine!r} in ASR spec {spec!r} (only 'fast:')")
    rest, *extras = rest.split("+")
    model, _, compute_type = rest.partition("@")
    overrides: dict[str, float] = {}
    for extra in extras:
        if extra in ENCODERS:
            continue
        key = next((k for k in SPEC_OPTIONS if extra.startswith(k)), None)
        try:
            value = float(extra[len(key):]) if key else None
        except ValueError:
            value = None
        if value is None:
            raise ValueError(f"bad +{extra} in ASR spec {spec!r}: "
                             "want +ov, +auto, +padN, +batchN, +chunkN or +beamN")
        overrides[SPEC_OPTIONS[key]] = int(value) if key in INT_OPTIONS else value
    encoder = next((ENCODERS[e] for e in extras if e in ENCODERS), "ct2")
    if not compute_type and engine != "fast":
        compute_type = "int8"
    return ASRSpec(engine or "ct2", model, compute_type or None, encoder, overrides)


class CachedASR:
    """Memoise transcripts by (model identity, decoding configuration, audio bytes), so an
    unchanged baseline costs nothing on the next gate call of a sweep."""

    def __init__(self, spec: str, threads: int = 0):
        from audiofast.asr.runtime import load_model

        parsed = parse_asr_spec(spec)
        engine, compute_type = parsed.engine, parsed.compute_type
        self.spec = spec
        self.options = replace(JUDGE_OPTIONS, **parsed.options)
        if engine == "fast":
            self.asr = load_model(parsed.model, "fast", threads=threads, precision=compute_type,
                                  encoder=parsed.encoder)
            resolved = self.asr.ct2.resolved
            compute_type = self.asr.engine.numerics
        else:
            self.asr = load_model(parsed.model, "ct2", threads=threads,
                                  compute_type=compute_type, encoder=parsed.encoder)
            resolved = self.asr.resolved
        weights = resolved.ct2_dir / "model.bin"
        stat = weights.stat()
        identity = (f"{weights.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{engine}:"
                    f"{compute_type}:{self.options}")
        if parsed.encoder != "ct2":
            identity += f":{parsed.encoder}"
        identity += f":{decoding_code_version()}"
        digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
        self.cache = cache_dir() / "transcripts" / digest

    def segments(self, audio: np.ndarray) -> list[tuple[float, float, str]]:
        """(start, end, text) of each transcribed segment, from the cache when possible."""
        key = hashlib.sha256(np.ascontiguousarray(audio).tobytes()).hexdigest()[:24]
        path = self.cache / f"{key}.json"
        if path.is_file():
            return [tuple(s) for s in json.loads(path.read_text())["segments"]]
        result = self.asr.transcribe(audio, self.options, progress=False)
        segments = [(s.start, s.end, s.text) for s in result.segments]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"spec": self.spec, "segments": segments}))
        tmp.replace(path)
        return segments


@functools.cache
def decoding_code_version() -> str:
    """What decides a transcript besides the weights and options: the audiofast version, a hash
    of the ASR lane's sources (decoding rules, engines, kernels), the ctranslate2 and torch
    versions and the CPU's vector ISA (int8 paths differ between AVX2 and AVX-512). A cached
    transcript made by other code is never served again."""
    import ctranslate2
    import torch

    from audiofast import __version__

    asr = Path(__file__).resolve().parents[1] / "asr"
    digest = hashlib.sha256()
    for path in sorted([*asr.rglob("*.py"), *asr.rglob("*.cpp"), *asr.rglob("*.h")]):
        digest.update(path.name.encode() + path.read_bytes())
    return (f"audiofast-{__version__}:src-{digest.hexdigest()[:12]}:ct2-{ctranslate2.__version__}"
            f":torch-{torch.__version__}:{cpu_isa()}")


def cpu_isa() -> str:
    """The widest integer-dot-product ISA this CPU has, as the int8 kernels choose it."""
    from audiofast.asr.kernels import cpu_flags

    flags = cpu_flags()
    if not flags:
        return "unknown"
    return next((isa for isa in ("avx512_vnni", "avx512f", "avx2") if isa in flags), "sse")


@dataclass
class EvalAudio:
    set: str
    voice: str
    item: str
    reference: str
    audio: np.ndarray


def build_eval_audio(
    texts: list[str], voices: tuple[str, ...] = DEFAULT_VOICES, augmentation: str | None = None,
    anchors: bool = True, seed: int = 0,
) -> list[EvalAudio]:
    """Every text in every voice (augmented if asked), plus the real recordings. ``seed``
    draws another realisation of the augmentation (another noise), for measuring how much
    a verdict owes to one draw (evals/gate_floor.py)."""
    items = [
        EvalAudio("tts", voice, f"{i:03d}", text,
                  augment.apply(load_audio(synthesize(text, voice)), augmentation,
                                seed=i + 100_003 * seed))
        for voice in tqdm(voices, desc="tts", leave=False)
        for i, text in enumerate(texts)
    ]
    if anchors:
        items += [EvalAudio("real", "human", c.name, c.reference, load_audio(c.audio))
                  for c in real_speech_clips()]
    return items


@dataclass
class Pack:
    """Several utterances of one voice in one window, with silence between: Whisper pays for
    a full 30 s window whatever it holds, so packing short TTS sentences makes the judge ~8x
    cheaper."""

    audio: np.ndarray
    members: list[EvalAudio]


def pack(items: list[EvalAudio], max_seconds: float = 24.0, gap: float = 1.5) -> list[Pack]:
    """Group consecutive items of one voice into packs of at most ``max_seconds``, each
    utterance preceded by ``gap`` seconds of silence and the pack closed by another."""
    silence = np.zeros(int(gap * SAMPLE_RATE), dtype=np.float32)
    packs: list[Pack] = []
    pieces: list[np.ndarray] = []
    members: list[EvalAudio] = []
    seconds = 0.0
    for item in items:
        length = len(item.audio) / SAMPLE_RATE
        if members and (seconds + gap + length > max_seconds or members[0].voice != item.voice):
            packs.append(Pack(np.concatenate([*pieces, silence]), members))
            pieces, members, seconds = [], [], 0.0
        pieces += [silence, item.audio]
        members.append(item)
        seconds += gap + length
    if members:
        packs.append(Pack(np.concatenate([*pieces, silence]), members))
    return packs


def score(asr: CachedASR, items: list[EvalAudio], desc: str = "") -> list[Utterance]:
    """Transcribe every item and count errors. TTS items are packed into shared windows and
    scored per pack - the pack's transcript against its sentences joined - because where
    Whisper puts segment boundaries in the silences is a near-tie: giving segments back to
    single sentences counted a segment spanning two of them as insertions in one and
    deletions in the other (up to 8 errors for correctly recognised words, measured)."""
    jobs = [(p.audio, p.members) for p in pack([i for i in items if i.set == "tts"])]
    jobs += [(i.audio, [i]) for i in items if i.set != "tts"]
    utterances = []
    for audio, members in tqdm(jobs, desc=desc or asr.spec, leave=False):
        hypothesis = "".join(text for _, _, text in asr.segments(audio)).strip()
        reference = " ".join(m.reference for m in members)
        errors, words = count_errors(reference, hypothesis)
        first = members[0]
        utterances.append(Utterance(first.set, first.voice, "+".join(m.item for m in members),
                                    reference, hypothesis, errors, words))
    return utterances


def summarize(utterances: list[Utterance]) -> dict:
    tts = [u for u in utterances if u.set == "tts"]
    real = [u for u in utterances if u.set == "real"]
    voices = dict.fromkeys(u.voice for u in tts)
    by_voice = {v: corpus_wer([u for u in tts if u.voice == v]) for v in voices}
    return {"tts_wer": corpus_wer(tts) if tts else None,
            "real_wer": corpus_wer(real) if real else None,
            "per_voice": by_voice, "per_pack": {f"{u.voice}/{u.item}": u.errors / u.words
                                                for u in tts},
            "per_clip": {u.item: u.errors / u.words for u in real}}


def compare(candidate: list[Utterance], baseline: list[Utterance]) -> dict:
    """Deltas (candidate - baseline) on TTS and on real speech, and the anchor-conflict flag."""
    pick = lambda us, s: [u for u in us if u.set == s]  # noqa: E731
    out: dict = {}
    for name in ("tts", "real"):
        c, b = pick(candidate, name), pick(baseline, name)
        if c:
            delta, lo, hi = bootstrap_delta(c, b)
            out[name] = {"delta": delta, "ci_low": lo, "ci_high": hi}
    # TTS says better while real speech says worse: the synthetic set is misleading here.
    out["anchor_conflict"] = bool(
        "tts" in out and "real" in out and out["tts"]["delta"] < 0 < out["real"]["delta"]
    )
    return out


def roundtrip(
    candidate: str, baseline: str | None = None, texts: list[str] | None = None,
    voices: tuple[str, ...] = DEFAULT_VOICES, augmentation: str | None = None,
    anchors: bool = True, threads: int = 0,
) -> dict:
    """The full report: candidate figures, and if a baseline is given, its figures and deltas."""
    items = build_eval_audio(texts or tts_texts(), voices, augmentation, anchors)
    cand = score(CachedASR(candidate, threads), items, "candidate")
    report = {"candidate": candidate, "voices": list(voices), "augmentation": augmentation,
              "candidate_summary": summarize(cand),
              "utterances": {"candidate": [asdict(u) for u in cand]}}
    if baseline:
        base = score(CachedASR(baseline, threads), items, "baseline")
        report |= {"baseline": baseline, "baseline_summary": summarize(base),
                   "delta": compare(cand, base)}
        report["utterances"]["baseline"] = [asdict(u) for u in base]
    return report
