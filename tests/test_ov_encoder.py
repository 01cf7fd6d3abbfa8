"""The OpenVINO encoder: the fp32 model's output at any window length, and real transcripts."""

import numpy as np
import pytest
import torch

from audiofast.asr.ct2_runtime import CT2Whisper
from audiofast.asr.features import log_mel_spectrogram, pad_or_trim
from audiofast.asr.options import TranscribeOptions
from audiofast.audio import load_audio
from audiofast.eval.wer import wer


@pytest.fixture(scope="module")
def ov_base() -> CT2Whisper:
    return CT2Whisper("whisper-base", threads=2, encoder="openvino")


def test_matches_the_pytorch_encoder_at_full_and_short_lengths(ov_base, clips):
    """The reference is transformers' own WhisperEncoder. It only takes 3000 frames, so the
    short window's reference runs its modules by hand - checked first to equal the real
    forward at 3000 frames, so the test does not compare the export with a copy of itself."""
    from audiofast.models.ct2_to_hf import whisper_from_ct2

    hf, _ = whisper_from_ct2(ov_base.resolved.ct2_dir)
    enc = hf.model.encoder.eval()
    mel = log_mel_spectrogram(load_audio(clips["beckett"].audio), ov_base.n_mels)

    def by_hand(window: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.gelu(enc.conv2(torch.nn.functional.gelu(enc.conv1(window))))
        x = x.transpose(1, 2) + enc.embed_positions.weight[: window.shape[-1] // 2]
        for layer in enc.layers:
            x = layer(x, attention_mask=None)
        return enc.layer_norm(x)

    with torch.no_grad():
        full = torch.from_numpy(pad_or_trim(mel, 3000)[None])
        real = enc(full).last_hidden_state
        assert torch.allclose(by_hand(full), real, atol=1e-5)
        short = torch.from_numpy(pad_or_trim(mel, 1200)[None])
        references = {3000: (full, real), 1200: (short, by_hand(short))}
    for frames, (window, want) in references.items():  # a standard window, a padded short one
        got = torch.from_numpy(np.array(ov_base.encode_batch(window.numpy())))
        assert got.shape == want.shape == (1, frames // 2, 512)
        diff = (got - want).abs()  # fp32 both, summed in a different order
        assert diff.mean() < 1e-4 and diff.max() < 0.02, (frames, diff.mean(), diff.max())


def test_real_speech_through_the_openvino_encoder(ov_base, clips):
    for name in ("two_cities", "beckett", "clone-test"):
        result = ov_base.transcribe(clips[name].audio, TranscribeOptions(window_pad=10.0))
        assert wer(clips[name].reference, result.text) <= 0.05, (name, result.text)


def test_export_is_cached_and_bad_encoder_names_are_refused(ov_base):
    from audiofast.asr.ov_encoder import OpenVINOEncoder

    again = OpenVINOEncoder(ov_base.resolved.ct2_dir, threads=2)
    assert again.path == ov_base.own_encoder.path
    assert again.path.stat().st_mtime_ns == ov_base.own_encoder.path.stat().st_mtime_ns
    with pytest.raises(ValueError, match="encoder must be one of auto, ct2, fused, openvino"):
        CT2Whisper("whisper-base", encoder="tpu")
