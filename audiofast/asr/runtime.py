"""One entry point: ``load_model(spec, engine="auto")`` returns something with ``transcribe()``.

A runtime is an encoder (CTranslate2 | OpenVINO) and a decoder (the fused C++ int8 decoder |
CTranslate2's | the fp32 reference). ``engine`` picks the decoder:

- ``"auto"`` (default): per call, the fused decoder for greedy decoding (sequential or
  batched chunks) where its kernels are built (the gated, faster configuration),
  CTranslate2's for beams, and CTranslate2's everywhere the kernels cannot run. One
  CTranslate2 model serves both (encoder and fallback decoder); the fused decoder is built
  on first use.
- ``"fast"``: the owned decoder always (drafters, ``precision="fp32"``), greedy only.
- ``"ct2"``: CTranslate2 alone (any ``compute_type``).

The CLI, the judge and the benchmarks load models through here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

from audiofast.asr.ct2_runtime import CT2Whisper
from audiofast.asr.options import TranscribeOptions
from audiofast.asr.types import Segment, Transcription
from audiofast.asr.vad_filter import VadFilterOptions
from audiofast.audio import AudioSource

Engine = Literal["auto", "fast", "ct2"]
ENGINES = ("auto", "fast", "ct2")


def auto_engine(options: TranscribeOptions, compute_type: str = "int8",
                precision: str | None = None, drafter: str = "none") -> str:
    """The decoder ``"auto"`` runs these options on: "fast" (the owned decoder) or "ct2".
    The owned decoder's own options ask for it; otherwise it is used for greedy int8
    decoding (batched chunks too: several windows per fused call) where its kernels are
    built (not built here: that takes a minute)."""
    from audiofast.asr import kernels

    if drafter != "none" or precision not in (None, "int8"):
        return "fast"
    greedy = options.beam_size == 1
    return "fast" if greedy and compute_type == "int8" and kernels.is_built() else "ct2"


class AutoWhisper:
    """CTranslate2 plus, where it may decode, the fused int8 decoder over the same model."""

    def __init__(self, ct2: CT2Whisper, threads: int = 0, seed: int = 0):
        self.ct2 = ct2
        self.threads = threads
        self.seed = seed
        self._fast = None

    def runtime_for(self, options: TranscribeOptions):
        """The runtime that decodes ``options`` (:func:`auto_engine`)."""
        if auto_engine(options) == "ct2":
            return self.ct2
        if self._fast is None:
            from audiofast.asr.fast_runtime import FastWhisper

            self._fast = FastWhisper(threads=self.threads, seed=self.seed, ct2=self.ct2)
        return self._fast

    def transcribe(self, audio: AudioSource, options: TranscribeOptions = TranscribeOptions(),
                   progress: bool | None = None,
                   vad_filter: bool | VadFilterOptions = False,
                   on_segment: Callable[[Segment], None] | None = None) -> Transcription:
        return self.runtime_for(options).transcribe(audio, options, progress, vad_filter,
                                                    on_segment)


def load_model(model: str | None = None, engine: Engine = "auto", *, threads: int = 0,
               compute_type: str = "int8", precision: str | None = None, encoder: str = "auto",
               drafter: str = "none", draft_model: str | Path | None = None, seed: int = 0,
               replicas: int = 1):
    """A Whisper model ready to ``transcribe()`` (``model``: a packaged name, a CTranslate2
    folder or a hub id; None: the packaged default). ``compute_type`` is CTranslate2's;
    ``precision`` (int8 | int4 | int4-head8 | int8-head4 | fp32; None: the model's own, see
    ``engine.model_precision``), ``drafter`` and ``draft_model`` are the owned decoder's, and
    asking for them selects it under ``"auto"``. ``replicas``: CTranslate2 copies that run
    calls from several threads at once (``CT2Whisper``)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    owned = drafter != "none" or precision not in (None, "int8")
    if engine == "ct2" or (engine == "auto" and compute_type != "int8" and not owned):
        return CT2Whisper(model, threads=threads, compute_type=compute_type, seed=seed,
                          encoder=encoder, replicas=replicas)
    ct2 = CT2Whisper(model, threads=threads, seed=seed, encoder=encoder, replicas=replicas)
    if engine == "fast" or owned:
        from audiofast.asr.fast_runtime import FastWhisper

        return FastWhisper(model, threads=threads, precision=precision, drafter=drafter,
                           seed=seed, draft_model=draft_model, ct2=ct2)
    return AutoWhisper(ct2, threads=threads, seed=seed)
