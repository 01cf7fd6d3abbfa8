"""The automatic gate at the end of a distillation stage: the student's clips against the
baseline's (the guided teacher as users ran it), on the same captions and seeds.

- **Proving-ground checkpoints** (MiniLM captions + spectrogram latents, whose captions say what
  the audio must be): FAD ratio to the baseline against held-out real synthetic clips, plus the
  teacher's objective metrics as ratios to the baseline's, pitch accuracy and category accuracy
  (:mod:`audiofast.diffusion.quality`).
- **Any other SA3 checkpoint** (no ground truth offline): FAD ratio against a reference set
  of the baseline's own clips at other seeds, ``FAD(student, ref) / FAD(baseline, ref)``: a
  label-free check that the student's distribution stays where the baseline's is.

The FAD ratio comes with a paired bootstrap interval (:mod:`audiofast.eval.fad_interval`):
the gate passes on the point ratio *and* the interval's upper end. Thresholds come from the
stage config's ``gate`` section; the verdict is the judge's
:class:`audiofast.eval.gate.Verdict` (``gate.json`` + ``gate.md`` beside the checkpoint).
"""

from __future__ import annotations

import time

import torch

from audiofast.diffusion.checkpoint import SA3Model
from audiofast.diffusion.distill_config import GateSpec
from audiofast.diffusion.generate import generate
from audiofast.diffusion.quality import clip_frames
from audiofast.eval.fad_interval import ClipMoments, RatioInterval, fad_ratio_interval
from audiofast.eval.gate import Verdict


def is_proving_ground(model: SA3Model) -> bool:
    from audiofast.diffusion.spectral import SpectrogramConfig

    texts = model.config.conditioning.text
    return isinstance(model.config.autoencoder, SpectrogramConfig) and all(
        t.kind == "minilm" for t in texts)


def generate_clips(model: SA3Model, captions: list[str], seconds: float, seed: int,
                   steps: int | None = None, cfg: float | None = None,
                   sampler: str | None = None, batch: int = 32) -> tuple[torch.Tensor, float]:
    """Clips for ``captions`` (prompt ``i`` seeded ``seed + i``) and the seconds it took."""
    start = time.perf_counter()
    audio = torch.cat([
        generate(model, captions[i : i + batch], seconds, steps=steps, cfg_scale=cfg,
                 sampler=sampler, seed=seed + i, progress=False)
        for i in range(0, len(captions), batch)
    ])
    return audio, time.perf_counter() - start


def _mono16k(audio: torch.Tensor, sample_rate: int) -> torch.Tensor:
    import torchaudio

    audio = audio.float().mean(dim=1, keepdim=True)
    if sample_rate != 16000:
        audio = torchaudio.functional.resample(audio, sample_rate, 16000)
    return audio


def gate_student(student: SA3Model, baseline: SA3Model, spec: GateSpec,
                 prompts: list[str] | None = None, label: tuple[str, str] = ("", "")) -> Verdict:
    """Score ``student`` (its own sampler, steps and folded guidance) against ``baseline`` at
    the spec's baseline settings."""
    start = time.perf_counter()
    verdict = Verdict("audio", label[0], label[1], passed=False)
    base = dict(steps=spec.baseline_steps, cfg=spec.baseline_cfg, sampler=spec.baseline_sampler)
    if is_proving_ground(student):
        from audiofast.diffusion.quality import build_judge
        from audiofast.diffusion.teacher import CLIP_SECONDS, SynthSet

        captions = SynthSet.build(spec.clips, seed=1000 + spec.seed)
        reference = SynthSet.build(spec.clips, seed=2000 + spec.seed)
        judge = build_judge(reference)
        cand, cand_s = generate_clips(student, captions.captions, CLIP_SECONDS, spec.seed)
        ref, ref_s = generate_clips(baseline, captions.captions, CLIP_SECONDS, spec.seed, **base)
        frames = [clip_frames(judge.embedder, a) for a in (cand, ref)]
        c = judge.score(cand, captions.meta, frames=frames[0])
        b = judge.score(ref, captions.meta, frames=frames[1])
        frames.append(judge.reference_frames)
        verdict.details = {"candidate": c | {"s_per_clip": cand_s / spec.clips},
                           "baseline": b | {"s_per_clip": ref_s / spec.clips}}
        _ratio_check(verdict, "pitch_accuracy_ratio", c["pitch_accuracy"], b["pitch_accuracy"],
                     spec.min_pitch_ratio)
        _ratio_check(verdict, "category_accuracy_ratio", c["category_accuracy"],
                     b["category_accuracy"], spec.min_category_ratio)
    else:
        from audiofast.eval.fad import WhisperEmbedder

        seconds = min(4.0, student.config.sample_size / student.config.sample_rate)
        captions = [prompts[i % len(prompts)] for i in range(spec.clips)] if prompts else None
        if not captions:
            raise ValueError("the gate of a non-proving-ground checkpoint needs prompts")
        sr = student.config.sample_rate
        cand = _mono16k(generate_clips(student, captions, seconds, spec.seed)[0], sr)
        ref = _mono16k(generate_clips(baseline, captions, seconds, spec.seed, **base)[0], sr)
        other = _mono16k(generate_clips(baseline, captions, seconds, spec.seed + 10_000,
                                        **base)[0], sr)
        embedder = WhisperEmbedder(threads=2, short_windows=True)
        frames = [clip_frames(embedder, a) for a in (cand, ref, other)]
        verdict.details = {"reference": "the baseline's clips at seeds + 10000"}
    interval = fad_ratio_interval(*(ClipMoments.of(f) for f in frames),
                                  replicates=spec.bootstrap_replicates, level=spec.interval_level,
                                  seed=spec.seed)
    fad_checks(verdict, interval, spec)
    verdict.passed = all(c["passed"] for c in verdict.checks)
    verdict.seconds = time.perf_counter() - start
    return verdict


def fad_checks(verdict: Verdict, interval: RatioInterval, spec: GateSpec) -> None:
    """The FAD checks: the point ratio and the interval's upper end. A point under the goal
    whose interval reaches past ``max_fad_ratio_upper`` is unresolved (too few clips, or a
    candidate that varies too much) and fails."""
    verdict.details["fad_ratio_interval"] = interval.to_dict()
    verdict.details.setdefault("candidate", {})["fad"] = interval.candidate_fad
    verdict.details.setdefault("baseline", {})["fad"] = interval.baseline_fad
    verdict.check("fad_ratio", interval.ratio, spec.max_fad_ratio,
                  interval.ratio <= spec.max_fad_ratio)
    verdict.check(f"fad_ratio_upper ({spec.interval_level:.0%} bootstrap)", interval.high,
                  spec.max_fad_ratio_upper, interval.high <= spec.max_fad_ratio_upper)


def _ratio_check(verdict: Verdict, name: str, cand: float, base: float, minimum: float) -> None:
    ratio = cand / base if base > 0 else (1.0 if cand >= base else 0.0)
    verdict.check(name, ratio, minimum, ratio >= minimum)
