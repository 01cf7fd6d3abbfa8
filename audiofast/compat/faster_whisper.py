"""faster-whisper 1.2's API on audiofast: change ``from faster_whisper import WhisperModel`` to
``from audiofast.compat.faster_whisper import WhisperModel`` and nothing else.

``WhisperModel(...).transcribe(...)`` has faster-whisper's signature and defaults (beam 5:
CTranslate2's beam search; ``beam_size=1`` runs audiofast's fused int8 greedy decoder) and
returns what it returns: a lazy generator of :class:`Segment` (nothing is decoded before the
first ``next``) and a :class:`TranscriptionInfo` whose language was detected up front. An
argument audiofast cannot honour raises ``ValueError`` naming it; none is silently ignored.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import BinaryIO

import numpy as np

from audiofast.asr.options import TranscribeOptions
from audiofast.asr.word_timing import APPEND_PUNCTUATION, PREPEND_PUNCTUATION
from audiofast.compat.faster_whisper_args import (
    faster_whisper_options,
    refuse,
    transcribe_options,
)
from audiofast.compat.faster_whisper_types import (
    Segment,
    TranscriptionInfo,
    TranscriptionOptions,
    VadOptions,
    Word,
)

__all__ = ["BatchedInferencePipeline", "Segment", "TranscriptionInfo", "TranscriptionOptions",
           "VadOptions", "WhisperModel", "Word", "available_models", "decode_audio",
           "format_timestamp"]

SIZES = ("tiny.en", "tiny", "base.en", "base", "small.en", "small", "medium.en", "medium",
         "large-v1", "large-v2", "large-v3", "large", "distil-large-v2", "distil-medium.en",
         "distil-small.en", "distil-large-v3", "distil-large-v3.5", "large-v3-turbo", "turbo")
DEFAULT_TEMPERATURES = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
COMPUTE_TYPES = {"default": "int8", "auto": "int8", "int8": "int8", "int8_float32": "int8",
                 "float32": "float32", "int16": "int16"}


def available_models() -> list[str]:
    """The size names ``WhisperModel`` takes (packaged ones load offline, others from the hub)."""
    return list(SIZES)


def model_spec(model_size_or_path: str) -> str:
    """A faster-whisper size as the audiofast model it means: the packaged models by their
    name, the others as the OpenAI checkpoint on the hub (converted to CTranslate2 once)."""
    from audiofast.models.packaged import PACKAGED_MODELS

    if model_size_or_path in SIZES:
        size = {"large": "large-v3", "turbo": "large-v3-turbo"}.get(model_size_or_path,
                                                                   model_size_or_path)
        if f"whisper-{size}" in PACKAGED_MODELS:
            return f"whisper-{size}"
        if size.startswith("distil-"):
            return f"distil-whisper/{size}"
        return f"openai/whisper-{size}"
    return model_size_or_path


def format_timestamp(seconds: float, always_include_hours: bool = False,
                     decimal_marker: str = ".") -> str:
    """``[HH:]MM:SS.mmm``, as faster-whisper's utility prints times (the subtitle writers')."""
    from audiofast.asr.writers import format_timestamp as subtitle_time

    return subtitle_time(seconds, decimal_marker, always_include_hours)


def decode_audio(input_file: str | BinaryIO, sampling_rate: int = 16000,
                 split_stereo: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Any file ffmpeg reads as float32 at ``sampling_rate``: mono, or (left, right)."""
    from audiofast.audio import AudioError, load_audio

    source = input_file.read() if hasattr(input_file, "read") else input_file
    if not split_stereo:
        return load_audio(source, sampling_rate)
    import io

    import av

    try:
        with av.open(io.BytesIO(source) if isinstance(source, bytes) else str(source),
                     metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise AudioError(f"{input_file}: no audio stream in the file")
            resampler = av.AudioResampler(format="flt", layout="stereo", rate=sampling_rate)
            frames = [f for frame in container.decode(container.streams.audio[0])
                      for f in resampler.resample(frame)] + resampler.resample(None)
    except AudioError:
        raise
    except Exception as err:
        raise AudioError(f"{input_file}: cannot decode audio ({str(err)[:200]})") from None
    interleaved = np.concatenate([f.to_ndarray().reshape(-1) for f in frames]) if frames \
        else np.zeros(0, np.float32)
    if interleaved.size == 0:
        raise AudioError(f"{input_file}: audio has no samples")
    return interleaved[0::2].copy(), interleaved[1::2].copy()


class WhisperModel:
    """faster-whisper's ``WhisperModel`` on audiofast's runtime (``load_model``, engine auto).

    CPU only. ``compute_type`` "default" / "int8" / "int8_float32" run the int8 model (the
    fused int8 decoder for greedy search), "float32" and "int16" CTranslate2 at that type.
    Calls from several threads are served one at a time (``num_workers`` > 1 is refused)."""

    def __init__(self, model_size_or_path: str, device: str = "auto",
                 device_index: int | list[int] = 0, compute_type: str = "default",
                 cpu_threads: int = 0, num_workers: int = 1, download_root: str | None = None,
                 local_files_only: bool = False, files: dict | None = None,
                 revision: str | None = None, use_auth_token: str | bool | None = None,
                 **model_kwargs):
        from audiofast.asr.runtime import load_model

        if device not in ("auto", "cpu"):
            raise ValueError(f"device={device!r} is not supported by audiofast: it runs on "
                             "the CPU (device='cpu' or 'auto')")
        if device_index not in (0, [0]):
            raise ValueError(f"device_index={device_index!r}: audiofast runs on one CPU device")
        if compute_type not in COMPUTE_TYPES:
            raise ValueError(f"compute_type={compute_type!r} is not supported on the CPU by "
                             f"audiofast; use one of {', '.join(COMPUTE_TYPES)}")
        refuse("num_workers", num_workers, 1, "one transcription runs at a time per model; "
               "for many streams use `audiofast serve`, for a corpus `transcribe --ray`")
        refuse("files", files, None, "models load from a directory, a package or the hub")
        refuse("download_root", download_root, None, "hub downloads go to the Hugging Face "
               "cache, set HF_HOME to move it")
        refuse("revision", revision, None, "hub models are fetched at their main revision")
        refuse("use_auth_token", use_auth_token, None, "set HF_TOKEN for gated hub models")
        if model_kwargs:
            raise ValueError(f"unknown model arguments: {', '.join(sorted(model_kwargs))}")
        spec = model_spec(model_size_or_path)
        if local_files_only and "/" in spec and not spec.startswith((".", "/", "~")):
            from pathlib import Path

            if not Path(spec).is_dir():
                raise ValueError(f"{model_size_or_path!r} is not packaged or on disk and "
                                 "local_files_only=True forbids the hub")
        self.runtime = load_model(spec, threads=cpu_threads,
                                  compute_type=COMPUTE_TYPES[compute_type])
        self.ct2 = getattr(self.runtime, "ct2", self.runtime)  # the CTranslate2 model
        self.tokenizer = self.ct2.tokenizer
        self._lock = threading.Lock()

    @property
    def supported_languages(self) -> list[str]:
        return sorted(self.tokenizer.languages) if self.tokenizer.multilingual else ["en"]

    def detect_language(self, audio: np.ndarray | None = None,
                        features: np.ndarray | None = None, vad_filter: bool = False,
                        vad_parameters: dict | VadOptions | None = None,
                        language_detection_segments: int = 1,
                        language_detection_threshold: float = 0.5,
                        ) -> tuple[str, float, list[tuple[str, float]]]:
        """(language, probability, every language's probability, most likely first) from the
        first 30 s (of the speech, with ``vad_filter``)."""
        from audiofast.asr.features import log_mel_spectrogram, pad_or_trim

        refuse("language_detection_segments", language_detection_segments, 1,
               "the language is detected on the first 30 s window")
        if (audio is None) == (features is None):
            raise ValueError("detect_language needs audio or features (one of them)")
        if not self.tokenizer.multilingual:
            raise ValueError("this model is English-only: it has no language to detect")
        if features is None:
            if vad_filter:
                audio = self._speech(audio, VadOptions.of(vad_parameters))[0]
            features = log_mel_spectrogram(np.asarray(audio, np.float32), self.ct2.n_mels)
        encoded = self.ct2.encode(pad_or_trim(np.asarray(features, np.float32)))
        with self._lock:
            ranked = self.ct2.model.detect_language(encoded)[0]
        probs = [(token[2:-2], float(prob)) for token, prob in ranked]
        return probs[0][0], probs[0][1], probs

    def _speech(self, audio: np.ndarray, vad: VadOptions):
        """The speech of ``audio`` joined end to end, and the regions it came from."""
        from audiofast.asr.vad_filter import speech_regions

        regions = speech_regions(audio, vad.to_filter_options())
        speech = np.concatenate([audio[s:e] for s, e in regions]) if regions \
            else np.zeros(0, np.float32)
        return speech, regions

    def transcribe(
        self, audio: str | BinaryIO | np.ndarray, language: str | None = None,
        task: str = "transcribe", log_progress: bool = False, beam_size: int = 5,
        best_of: int = 5, patience: float = 1, length_penalty: float = 1,
        repetition_penalty: float = 1, no_repeat_ngram_size: int = 0,
        temperature: float | list[float] | tuple[float, ...] = DEFAULT_TEMPERATURES,
        compression_ratio_threshold: float | None = 2.4,
        log_prob_threshold: float | None = -1.0, no_speech_threshold: float | None = 0.6,
        condition_on_previous_text: bool = True, prompt_reset_on_temperature: float = 0.5,
        initial_prompt: str | Iterable[int] | None = None, prefix: str | None = None,
        suppress_blank: bool = True, suppress_tokens: list[int] | None = [-1],  # noqa: B006
        without_timestamps: bool = False, max_initial_timestamp: float = 1.0,
        word_timestamps: bool = False, prepend_punctuations: str = PREPEND_PUNCTUATION,
        append_punctuations: str = APPEND_PUNCTUATION, multilingual: bool = False,
        vad_filter: bool = False, vad_parameters: dict | VadOptions | None = None,
        max_new_tokens: int | None = None, chunk_length: int | None = None,
        clip_timestamps: str | list[float] = "0",
        hallucination_silence_threshold: float | None = None, hotwords: str | None = None,
        language_detection_threshold: float | None = 0.5, language_detection_segments: int = 1,
    ) -> tuple[Iterator[Segment], TranscriptionInfo]:
        """faster-whisper's ``transcribe``: see the module docstring."""
        options = dict(locals())
        del options["self"], options["audio"]
        return self._transcribe(audio, options, batch_size=0)

    def _transcribe(self, audio, args: dict, batch_size: int
                    ) -> tuple[Iterator[Segment], TranscriptionInfo]:
        chunk = args["chunk_length"]
        if not batch_size and chunk not in (None, 30):
            raise ValueError(f"chunk_length={chunk!r} is not supported by audiofast's "
                             "sequential loop (Whisper's windows are 30 s); leave it at None")
        if batch_size and chunk is not None and not 0 < chunk <= 30:
            raise ValueError(f"chunk_length must be in (0, 30] seconds, not {chunk!r}")
        clips = args["clip_timestamps"]
        refuse("clip_timestamps", clips, "0" if not batch_size else None,
               "cut the audio before transcribing it")
        refuse("language_detection_segments", args["language_detection_segments"], 1,
               "the language is detected on the first 30 s window")
        ours = transcribe_options(args, batch_size)
        if not isinstance(audio, np.ndarray):
            audio = decode_audio(audio)
        else:
            from audiofast.audio import load_audio

            audio = load_audio(audio)
        duration = len(audio) / 16000
        vad = VadOptions.of(args["vad_parameters"]) if args["vad_filter"] else None
        speech, regions = self._speech(audio, vad) if vad else (audio, None)
        language, probability, all_probs = ours.language, 1.0, None
        if ours.language is None and not self.tokenizer.multilingual:
            language = "en"
        elif ours.language is None and len(speech):
            language, probability, all_probs = self.detect_language(speech)
        info = TranscriptionInfo(
            language=language or "en", language_probability=probability, duration=duration,
            duration_after_vad=len(speech) / 16000, all_language_probs=all_probs,
            transcription_options=faster_whisper_options(args, ours), vad_options=vad)
        ours = replace(ours, language=language)
        return self._segments(audio, ours, vad, regions, args["log_progress"]), info

    def _segments(self, audio: np.ndarray, options: TranscribeOptions, vad: VadOptions | None,
                  regions, progress: bool) -> Iterator[Segment]:
        """Decode on a worker thread when the caller first asks; hand segments over as each
        window finishes. Closing the generator early stops the decode at the next window."""
        from audiofast.asr.vad_filter import transcribe_speech

        if vad is not None and not regions:
            return
        # Unbounded: a worker never waits on the caller while it holds the model's lock.
        handoff: queue.Queue = queue.Queue()
        stop = threading.Event()
        done = object()

        def each(segment) -> None:
            if stop.is_set():
                raise _Stopped
            handoff.put(segment)

        def work() -> None:
            try:
                with self._lock:
                    if vad is None:
                        self.runtime.transcribe(audio, options, progress, False, each)
                    else:
                        transcribe_speech(
                            lambda s, on: self.runtime.transcribe(s, options, progress,
                                                                  False, on),
                            audio, vad.to_filter_options(), each, regions=regions)
                handoff.put(done)
            except _Stopped:
                pass
            except BaseException as err:  # handed to the caller's thread
                handoff.put(err)

        worker = threading.Thread(target=work, name="audiofast-transcribe", daemon=True)
        worker.start()
        count = 0
        try:
            while (item := handoff.get()) is not done:
                if isinstance(item, BaseException):
                    raise item
                count += 1
                yield Segment.of(item, count)
        finally:
            stop.set()  # the worker stops at its next segment
            worker.join()


class _Stopped(Exception):
    """Raised inside the decode when the consumer closed the generator."""


class BatchedInferencePipeline:
    """faster-whisper's batched pipeline: VAD (on by default) then chunks of speech decoded
    ``batch_size`` at a time by audiofast's batched loop (batched.py)."""

    def __init__(self, model: WhisperModel):
        if not isinstance(model, WhisperModel):
            raise TypeError("BatchedInferencePipeline needs an audiofast.compat.faster_whisper"
                            f".WhisperModel, not {type(model).__name__}")
        self.model = model

    def transcribe(
        self, audio: str | BinaryIO | np.ndarray, language: str | None = None,
        task: str = "transcribe", log_progress: bool = False, beam_size: int = 5,
        best_of: int = 5, patience: float = 1, length_penalty: float = 1,
        repetition_penalty: float = 1, no_repeat_ngram_size: int = 0,
        temperature: float | list[float] | tuple[float, ...] = DEFAULT_TEMPERATURES,
        compression_ratio_threshold: float | None = 2.4,
        log_prob_threshold: float | None = -1.0, no_speech_threshold: float | None = 0.6,
        condition_on_previous_text: bool = True, prompt_reset_on_temperature: float = 0.5,
        initial_prompt: str | Iterable[int] | None = None, prefix: str | None = None,
        suppress_blank: bool = True, suppress_tokens: list[int] | None = [-1],  # noqa: B006
        without_timestamps: bool = True, max_initial_timestamp: float = 1.0,
        word_timestamps: bool = False, prepend_punctuations: str = PREPEND_PUNCTUATION,
        append_punctuations: str = APPEND_PUNCTUATION, multilingual: bool = False,
        vad_filter: bool = True, vad_parameters: dict | VadOptions | None = None,
        max_new_tokens: int | None = None, chunk_length: int | None = None,
        clip_timestamps: list[dict] | None = None,
        hallucination_silence_threshold: float | None = None, batch_size: int = 8,
        hotwords: str | None = None, language_detection_threshold: float | None = 0.5,
        language_detection_segments: int = 1,
    ) -> tuple[Iterator[Segment], TranscriptionInfo]:
        """faster-whisper's batched ``transcribe``: the same arguments plus ``batch_size``."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        options = dict(locals())
        del options["self"], options["audio"], options["batch_size"]
        return self.model._transcribe(audio, options, batch_size=batch_size)
