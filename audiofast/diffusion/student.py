"""What a distilled SA3 checkpoint carries beyond upstream's config: its guidance, its sampler and
its quantization, under one ``"audiofast"`` key of ``model_config.json``.

Upstream's loaders ignore unknown top-level keys, so a fixed-scale CFG-folded student (same tensors
as its teacher) stays loadable by them. Everything here is read back by
:func:`audiofast.diffusion.generate.generate`, so ``audiofast generate --model STUDENT`` samples a
student the way it was trained to be sampled without any flag.

    "audiofast": {
      "stage": "steps", "parent": "evals/teacher",
      "guidance": {"scale": 5.0, "range": [1.0, 7.0], "apg_scale": 1.0},
      "sampler": {"name": "pingpong", "times": [1.0, 0.74, 0.47, 0.21, 0.0]},
      "quantization": {"scheme": "w8a8", "weights": "per-channel symmetric int8",
                       "activations": "per-token dynamic uint8", "modules": "dit linears"}
    }
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from audiofast.diffusion.config_schema import ConfigError, Section

if TYPE_CHECKING:
    from audiofast.diffusion.config import SA3Config

KEY = "audiofast"
QUANT_SCHEMES = ("w8a8",)


@dataclass(frozen=True)
class FoldedGuidance:
    """Classifier-free guidance distilled into the network: one pass per step.

    ``range`` set means the DiT has a guidance-scale embedding and accepts any scale inside it
    (``scale`` is then the default); without it only ``scale`` itself is available."""

    scale: float
    range: tuple[float, float] | None = None
    apg_scale: float = 1.0

    def check(self, requested: float | None) -> float:
        """The scale to run at for a requested ``--cfg`` (None: the default); one line if not."""
        if requested is None:
            return self.scale
        if self.range is None:
            if abs(requested - self.scale) > 1e-6:
                raise ValueError(
                    f"this checkpoint has guidance {self.scale:g} folded in; pass --cfg "
                    f"{self.scale:g} or leave it out"
                )
            return self.scale
        lo, hi = self.range
        if not lo - 1e-6 <= requested <= hi + 1e-6:
            raise ValueError(f"guidance scale {requested:g} is outside this checkpoint's folded "
                             f"range [{lo:g}, {hi:g}]")
        return float(requested)


@dataclass(frozen=True)
class StudentSampler:
    """The sampler a student was distilled for, with its exact times (t = 1 ... 0)."""

    name: str
    times: tuple[float, ...]

    @property
    def steps(self) -> int:
        return len(self.times) - 1

    @staticmethod
    def valid_times(times) -> bool:
        """At least one step, strictly decreasing from exactly 1.0 to exactly 0.0."""
        pairs = zip(times[:-1], times[1:], strict=True)
        return (len(times) >= 2 and times[0] == 1.0 and times[-1] == 0.0
                and all(a > b for a, b in pairs))


@dataclass(frozen=True)
class StudentConfig:
    stage: str
    parent: str
    guidance: FoldedGuidance | None
    sampler: StudentSampler | None
    quantization: dict[str, Any] | None

    @classmethod
    def from_dict(cls, data: dict) -> StudentConfig:
        s = Section(data, KEY)
        guidance = sampler = None
        if s.data.get("guidance") is not None:
            g = s.sub("guidance")
            scale = g.get("scale")
            if not isinstance(scale, (int, float)):
                raise g.fail("needs a numeric scale")
            rng = g.get("range")
            if rng is not None and (
                not isinstance(rng, list) or len(rng) != 2 or not rng[0] <= scale <= rng[1]
            ):
                raise g.fail(f"has range {rng!r} that is not [low, high] around scale {scale}")
            guidance = FoldedGuidance(float(scale), None if rng is None else
                                      (float(rng[0]), float(rng[1])),
                                      float(g.get("apg_scale", 1.0)))
        if s.data.get("sampler") is not None:
            p = s.sub("sampler")
            times = p.get("times")
            if not isinstance(times, list) or not StudentSampler.valid_times(times):
                raise p.fail("needs times decreasing from 1.0 to 0.0")
            sampler = StudentSampler(p.get("name", "pingpong", ("pingpong", "euler")),
                                     tuple(float(t) for t in times))
        quant = s.data.get("quantization")
        if quant is not None:
            Section(quant, f"{KEY}.quantization").get("scheme", None, QUANT_SCHEMES)
        return cls(str(s.get("stage", "")), str(s.get("parent", "")), guidance, sampler, quant)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stage": self.stage, "parent": self.parent}
        if self.guidance is not None:
            g = self.guidance
            out["guidance"] = {"scale": g.scale, "apg_scale": g.apg_scale}
            if g.range is not None:
                out["guidance"]["range"] = list(g.range)
        if self.sampler is not None:
            out["sampler"] = {"name": self.sampler.name, "times": list(self.sampler.times)}
        if self.quantization is not None:
            out["quantization"] = dict(self.quantization)
        return out


def read_student(raw: dict) -> StudentConfig | None:
    data = raw.get(KEY)
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ConfigError(f"malformed SA3 config: {KEY} is not an object")
    return StudentConfig.from_dict(data)


def with_student(config: SA3Config, student: StudentConfig | None) -> SA3Config:
    """``config`` with another student section (its raw JSON updated to match)."""
    raw = {k: v for k, v in config.raw.items() if k != KEY}
    if student is not None:
        raw[KEY] = student.to_dict()
    return replace(config, raw=raw, student=student)
