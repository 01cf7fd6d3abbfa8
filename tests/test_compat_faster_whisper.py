"""audiofast.compat.faster_whisper against the real faster-whisper 1.2.1, both on the packaged
CTranslate2 models and the real recordings: same signatures, same record fields and types,
the same transcripts' WER, and a clear error for every argument audiofast cannot honour."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from pathlib import Path

import faster_whisper as theirs  # the reference: a dev dependency, pinned
import numpy as np
import pytest
import soundfile
from faster_whisper import transcribe as theirs_transcribe
from faster_whisper import vad as theirs_vad

import audiofast.compat.faster_whisper as ours
from audiofast.audio import AudioError
from audiofast.eval.wer import wer
from audiofast.models.resolve import resolve_model


@pytest.fixture(scope="module")
def ours_tiny(kernel) -> ours.WhisperModel:
    return ours.WhisperModel("tiny.en", cpu_threads=2)


@pytest.fixture(scope="module")
def theirs_tiny():
    return theirs.WhisperModel(str(resolve_model("whisper-tiny.en").ct2_dir), device="cpu",
                               compute_type="int8", cpu_threads=2)


PAIRS = [
    (ours.WhisperModel.__init__, theirs.WhisperModel.__init__),
    (ours.WhisperModel.transcribe, theirs.WhisperModel.transcribe),
    (ours.WhisperModel.detect_language, theirs.WhisperModel.detect_language),
    (ours.BatchedInferencePipeline.__init__, theirs.BatchedInferencePipeline.__init__),
    (ours.BatchedInferencePipeline.transcribe, theirs.BatchedInferencePipeline.transcribe),
    (ours.decode_audio, theirs.decode_audio),
    (ours.format_timestamp, theirs_transcribe.format_timestamp),
]


@pytest.mark.parametrize(("mine", "real"), PAIRS, ids=lambda f: f.__qualname__)
def test_signatures_match(mine, real):
    """Every parameter, in order, with its kind and default."""
    def shape(function):
        return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters
                .values()]
    assert shape(mine) == shape(real)


def normal(hint):
    """A type hint in one spelling: Optional[List[int]] == list[int] | None."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return ("union", frozenset(normal(a) for a in typing.get_args(hint)))
    if origin is not None:
        import collections.abc

        origin = {collections.abc.Iterable: typing.Iterable}.get(origin, origin)
        return (origin, tuple(normal(a) for a in typing.get_args(hint)))
    return hint.__name__ if isinstance(hint, type) else hint


RECORDS = [(ours.Segment, theirs_transcribe.Segment), (ours.Word, theirs_transcribe.Word),
           (ours.TranscriptionInfo, theirs_transcribe.TranscriptionInfo),
           (ours.TranscriptionOptions, theirs_transcribe.TranscriptionOptions),
           (ours.VadOptions, theirs_vad.VadOptions)]


@pytest.mark.parametrize(("mine", "real"), RECORDS, ids=lambda c: c.__name__)
def test_record_fields_match(mine, real):
    hints_mine, hints_real = typing.get_type_hints(mine), typing.get_type_hints(real)
    names = [f.name for f in dataclasses.fields(real)]
    assert [f.name for f in dataclasses.fields(mine)] == names
    for name in names:
        if name in ("transcription_options", "vad_options"):  # each side's own record class
            continue
        assert normal(hints_mine[name]) == normal(hints_real[name]), name
    if real is theirs_vad.VadOptions:
        assert dataclasses.asdict(mine()) == dataclasses.asdict(real())


def kind(value) -> str:
    """What a caller can rely on of a value (faster-whisper's times are sometimes numpy
    float64, a float subclass)."""
    for t in (bool, int, float, str, list):
        if isinstance(value, t):
            return t.__name__
    return type(value).__name__


def run(model, path, **kwargs):
    segments, info = model.transcribe(str(path), **kwargs)
    return list(segments), info


@pytest.mark.parametrize("beam_size", [5, 1])
def test_transcripts_match_faster_whisper(ours_tiny, theirs_tiny, clips, beam_size):
    """The real recordings: WER equal to faster-whisper's at its default beam search and
    greedy (ours: the fused int8 decoder), every value of the same type, info alike."""
    refs, mine_text, real_text = [], [], []
    for clip in clips.values():
        mine, mine_info = run(ours_tiny, clip.audio, beam_size=beam_size,
                              word_timestamps=True)
        real, real_info = run(theirs_tiny, clip.audio, beam_size=beam_size,
                              word_timestamps=True)
        refs.append(clip.reference)
        mine_text.append("".join(s.text for s in mine))
        real_text.append("".join(s.text for s in real))
        assert [s.id for s in mine] == list(range(1, len(mine) + 1))
        for a, b in zip(mine[:1] + mine[-1:], real[:1] + real[-1:], strict=True):
            for field in dataclasses.fields(b):
                va, vb = getattr(a, field.name), getattr(b, field.name)
                assert kind(va) == kind(vb), field.name
            for word in dataclasses.fields(b.words[0]):
                assert kind(getattr(a.words[0], word.name)) == \
                    kind(getattr(b.words[0], word.name)), word.name
        assert abs(mine[-1].end - real[-1].end) < 1.0
        for field in ("language", "language_probability", "duration", "duration_after_vad",
                      "all_language_probs"):
            assert getattr(mine_info, field) == pytest.approx(getattr(real_info, field)), field
        assert mine_info.transcription_options.beam_size == beam_size
        assert mine_info.vad_options is real_info.vad_options is None
    mine_wer, real_wer = wer(refs, mine_text), wer(refs, real_text)
    assert mine_wer <= real_wer + 0.005, (mine_wer, real_wer)
    assert mine_wer < 0.07  # tiny.en: faster-whisper itself is at 5.1 % on these four


def test_segments_are_lazy_and_closable(ours_tiny, clips):
    """Nothing decodes before the first ``next``; a generator closed after one segment frees
    the model for the next call; bad audio fails in ``transcribe`` itself, as faster-whisper's."""
    long_clip = max(clips.values(), key=lambda c: soundfile.info(str(c.audio)).duration)
    segments, info = ours_tiny.transcribe(str(long_clip.audio), beam_size=1)
    assert isinstance(segments, types.GeneratorType)
    assert inspect.getgeneratorstate(segments) == inspect.GEN_CREATED
    first = next(segments)
    assert first.id == 1 and first.start < 1.0
    segments.close()
    again, _ = ours_tiny.transcribe(str(long_clip.audio), beam_size=1)
    assert next(again).text == first.text
    again.close()
    with pytest.raises(AudioError, match="no such file"):
        ours_tiny.transcribe("/nonexistent.wav")


def test_vad_filter_matches_faster_whisper(ours_tiny, theirs_tiny, clips, tmp_path):
    """4 s of silence each side of a real clip: both cut about the same, times on the
    original timeline, the words alike."""
    clip = clips["beckett"]
    audio = ours.decode_audio(str(clip.audio))
    silence = np.zeros(4 * 16000, np.float32)
    padded = np.concatenate([silence, audio, silence])
    mine, mine_info = ours_tiny.transcribe(padded, beam_size=1, vad_filter=True)
    mine = list(mine)
    real, real_info = theirs_tiny.transcribe(padded, beam_size=1, vad_filter=True)
    real = list(real)
    assert mine_info.duration == pytest.approx(real_info.duration)
    assert mine_info.duration_after_vad == pytest.approx(real_info.duration_after_vad, abs=0.3)
    assert mine_info.duration_after_vad < mine_info.duration - 6
    assert dataclasses.asdict(mine_info.vad_options) == dataclasses.asdict(real_info.vad_options)
    assert mine[0].start > 3.0 and abs(mine[0].start - real[0].start) < 0.5
    assert wer(clip.reference, "".join(s.text for s in mine)) <= \
        wer(clip.reference, "".join(s.text for s in real)) + 0.02


def test_batched_pipeline(ours_tiny, theirs_tiny, clips):
    clip = clips["two_cities"]
    mine, info = ours.BatchedInferencePipeline(ours_tiny).transcribe(str(clip.audio),
                                                                      batch_size=4)
    mine = list(mine)
    real, _ = theirs.BatchedInferencePipeline(theirs_tiny).transcribe(str(clip.audio),
                                                                       batch_size=4)
    real = list(real)
    assert info.vad_options is not None and info.transcription_options.without_timestamps
    mine_wer = wer(clip.reference, "".join(s.text for s in mine))
    assert mine_wer <= wer(clip.reference, "".join(s.text for s in real)) + 0.02
    assert mine_wer < 0.05
    with pytest.raises(ValueError, match="word_timestamps"):
        ours.BatchedInferencePipeline(ours_tiny).transcribe(str(clip.audio),
                                                            word_timestamps=True)
    with pytest.raises(TypeError, match="WhisperModel"):
        ours.BatchedInferencePipeline(object())


def test_detect_language_multilingual(clips):
    """whisper-base (multilingual): the same language, probability and ranking length."""
    mine_model = ours.WhisperModel("base", cpu_threads=2)
    real_model = theirs.WhisperModel(str(resolve_model("whisper-base").ct2_dir), device="cpu",
                                     compute_type="int8", cpu_threads=2)
    audio = ours.decode_audio(str(clips["endgame_nagg_nell"].audio))
    mine = mine_model.detect_language(audio)
    real = real_model.detect_language(audio)
    assert mine[0] == real[0] == "en"
    assert mine[1] == pytest.approx(real[1], abs=0.05)
    assert len(mine[2]) == len(real[2]) and mine[2][0][0] == "en"
    _, info = mine_model.transcribe(audio, beam_size=1)
    assert info.language == "en" and info.all_language_probs[0][0] == "en"
    _, given = mine_model.transcribe(audio, beam_size=1, language="en")
    assert given.language_probability == 1 and given.all_language_probs is None


def test_decode_audio_matches(clips, ffmpeg, tmp_path):
    from tests.conftest import convert

    stereo = convert(ffmpeg, Path(clips["beckett"].audio), tmp_path / "s.mp3", 44100, 2)
    mine_l, mine_r = ours.decode_audio(str(stereo), split_stereo=True)
    real_l, real_r = theirs.decode_audio(str(stereo), split_stereo=True)
    assert mine_l.shape == real_l.shape and mine_r.shape == real_r.shape
    assert np.abs(mine_l - real_l).max() < 1e-4
    with open(stereo, "rb") as f:
        mono = ours.decode_audio(f)
    assert abs(len(mono) - len(real_l)) < 16 and mono.dtype == np.float32


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(repetition_penalty=1.1), "repetition_penalty"),
    (dict(no_repeat_ngram_size=3), "no_repeat_ngram_size"),
    (dict(hotwords="Dickens"), "hotwords"),
    (dict(prefix="It was"), "prefix"),
    (dict(multilingual=True), "multilingual"),
    (dict(clip_timestamps="1,5"), "clip_timestamps"),
    (dict(chunk_length=10), "chunk_length"),
    (dict(initial_prompt=[50363, 632]), "initial_prompt"),
    (dict(prompt_reset_on_temperature=0.2), "prompt_reset_on_temperature"),
    (dict(language_detection_segments=3), "language_detection_segments"),
    (dict(vad_filter=True, vad_parameters={"max_speech_duration_s": 10}),
     "max_speech_duration_s"),
    (dict(vad_filter=True, vad_parameters={"bogus": 1}), "bogus"),
    (dict(language="fr"), "English-only"),
    (dict(temperature=[]), "temperature"),
])
def test_unsupported_arguments_fail_clearly(ours_tiny, clips, kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        segments, _ = ours_tiny.transcribe(str(clips["beckett"].audio), **kwargs)
        next(segments)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(device="cuda"), "CPU"), (dict(compute_type="float16"), "compute_type"),
    (dict(num_workers=2), "num_workers"), (dict(download_root="/tmp/x"), "download_root"),
    (dict(device_index=1), "device_index"), (dict(flash_attention=True), "flash_attention"),
])
def test_unsupported_model_arguments_fail_clearly(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ours.WhisperModel("tiny.en", **kwargs)


def test_model_names():
    assert ours.model_spec("tiny.en") == "whisper-tiny.en"
    assert ours.model_spec("base") == "whisper-base"
    assert ours.model_spec("small") == "openai/whisper-small"
    assert ours.model_spec("distil-large-v3") == "distil-whisper/distil-large-v3"
    assert set(theirs.available_models()) <= set(ours.available_models())
