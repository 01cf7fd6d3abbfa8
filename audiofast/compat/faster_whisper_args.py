"""faster-whisper's ``transcribe`` arguments as audiofast's ``TranscribeOptions``, and back as
the ``TranscriptionOptions`` its ``TranscriptionInfo`` reports; an argument with no equivalent
is refused in one line (:func:`refuse`), never ignored."""

from __future__ import annotations

from audiofast.asr.options import TranscribeOptions
from audiofast.asr.word_timing import APPEND_PUNCTUATION, PREPEND_PUNCTUATION
from audiofast.compat.faster_whisper_types import TranscriptionOptions


def refuse(name: str, value: object, default: object, why: str) -> None:
    """One clear line for an argument audiofast cannot honour (never a silent ignore)."""
    if value != default:
        raise ValueError(f"{name}={value!r} is not supported by audiofast ({why}); "
                         f"leave it at {default!r}")


def given_temperatures(args: dict) -> tuple[float, ...]:
    """``temperature`` (one value or a sequence) as a tuple of floats."""
    temperature = args["temperature"]
    temperatures = tuple(float(t) for t in (
        temperature if isinstance(temperature, list | tuple) else [temperature]))
    if not temperatures:
        raise ValueError("temperature must name at least one value")
    return temperatures


def transcribe_options(args: dict, batch_size: int) -> TranscribeOptions:
    """faster-whisper's arguments as audiofast's options; refuses what has no equivalent."""
    refuse("repetition_penalty", args["repetition_penalty"], 1, "no repetition penalty")
    refuse("no_repeat_ngram_size", args["no_repeat_ngram_size"], 0, "no n-gram blocking")
    refuse("prompt_reset_on_temperature", args["prompt_reset_on_temperature"], 0.5,
           "the prompt resets after windows decoded above 0.5")
    refuse("prefix", args["prefix"], None, "no forced prefix")
    refuse("hotwords", args["hotwords"], None, "no hotword prompt")
    refuse("multilingual", args["multilingual"], False, "one language per file")
    refuse("prepend_punctuations", args["prepend_punctuations"], PREPEND_PUNCTUATION,
           "word timing joins Whisper's standard punctuation")
    refuse("append_punctuations", args["append_punctuations"], APPEND_PUNCTUATION,
           "word timing joins Whisper's standard punctuation")
    prompt = args["initial_prompt"]
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError("initial_prompt as token ids is not supported by audiofast; pass "
                         "the text")
    if args["task"] not in ("transcribe", "translate"):
        raise ValueError(f"task must be 'transcribe' or 'translate', not {args['task']!r}")
    if args["beam_size"] < 1:
        raise ValueError(f"beam_size must be at least 1, not {args['beam_size']}")
    if batch_size and args["word_timestamps"]:
        raise ValueError("word_timestamps=True is not supported by audiofast's batched loop;"
                         " use WhisperModel.transcribe")
    temperatures = given_temperatures(args)
    suppress = args["suppress_tokens"]
    return TranscribeOptions(
        language=args["language"], task=args["task"], beam_size=args["beam_size"],
        best_of=args["best_of"], patience=float(args["patience"]),
        length_penalty=float(args["length_penalty"]),
        without_timestamps=args["without_timestamps"],
        max_initial_timestamp=args["max_initial_timestamp"],
        suppress_blank=args["suppress_blank"],
        suppress_tokens=tuple(suppress) if suppress is not None else (),
        max_new_tokens=args["max_new_tokens"] or TranscribeOptions.max_new_tokens,
        # faster-whisper's batched pipeline decodes each chunk once, at the first temperature
        # (no fallback), on a 30 s window: the same here, so its transcripts are ours too.
        temperatures=temperatures[:1] if batch_size else temperatures,
        compression_ratio_threshold=args["compression_ratio_threshold"],
        log_prob_threshold=args["log_prob_threshold"],
        no_speech_threshold=args["no_speech_threshold"],
        condition_on_previous_text=args["condition_on_previous_text"] and not batch_size,
        initial_prompt=prompt, word_timestamps=args["word_timestamps"],
        hallucination_silence_threshold=args["hallucination_silence_threshold"],
        window_pad=None if batch_size else TranscribeOptions.window_pad, batch_size=batch_size,
        chunk_length=float(args["chunk_length"] or (30 if batch_size else 25)),
    )


def faster_whisper_options(args: dict, ours: TranscribeOptions) -> TranscriptionOptions:
    """The info's record of the options, as faster-whisper fills it."""
    return TranscriptionOptions(
        beam_size=ours.beam_size, best_of=ours.best_of, patience=ours.patience,
        length_penalty=ours.length_penalty, repetition_penalty=args["repetition_penalty"],
        no_repeat_ngram_size=args["no_repeat_ngram_size"],
        log_prob_threshold=ours.log_prob_threshold,
        no_speech_threshold=ours.no_speech_threshold,
        compression_ratio_threshold=ours.compression_ratio_threshold,
        condition_on_previous_text=ours.condition_on_previous_text,
        prompt_reset_on_temperature=args["prompt_reset_on_temperature"],
        temperatures=list(given_temperatures(args)), initial_prompt=ours.initial_prompt,
        prefix=args["prefix"], suppress_blank=ours.suppress_blank,
        suppress_tokens=list(ours.suppress_tokens), without_timestamps=ours.without_timestamps,
        max_initial_timestamp=ours.max_initial_timestamp, word_timestamps=ours.word_timestamps,
        prepend_punctuations=args["prepend_punctuations"],
        append_punctuations=args["append_punctuations"], multilingual=args["multilingual"],
        max_new_tokens=args["max_new_tokens"], clip_timestamps=args["clip_timestamps"],
        hallucination_silence_threshold=ours.hallucination_silence_threshold,
        hotwords=args["hotwords"])

