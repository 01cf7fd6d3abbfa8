"""The fused encoder (int8 kernels + float attention in one C++ op): close to the float32
encoder at full and short windows, batch-invariant, real transcripts, and bad input refused."""

import numpy as np
import pytest
import torch

from audiofast.asr import kernels
from audiofast.asr.ct2_runtime import CT2Whisper
from audiofast.asr.features import log_mel_spectrogram, pad_or_trim
from audiofast.asr.options import TranscribeOptions
from audiofast.audio import load_audio
from audiofast.eval.wer import wer

pytestmark = pytest.mark.skipif(kernels.backend() == "none", reason="C++ kernels not built")


@pytest.fixture(scope="module")
def fused_base() -> CT2Whisper:
    return CT2Whisper("whisper-base", threads=2, encoder="fused")


def test_close_to_the_float_encoder_and_no_worse_than_ctranslate2(fused_base, clips):
    """The reference is transformers' WhisperEncoder modules on the same weights (at 3000
    frames its own forward; shorter windows by hand, as test_ov_encoder checks). The int8
    encoders are not exact: each must stay near it, and ours no farther than CTranslate2's."""
    from audiofast.asr.ov_encoder import _EncoderForExport
    from audiofast.models.ct2_to_hf import whisper_from_ct2

    hf, _ = whisper_from_ct2(fused_base.resolved.ct2_dir)
    exact = _EncoderForExport(hf.model.encoder).eval()
    mel = log_mel_spectrogram(load_audio(clips["two_cities"].audio), fused_base.n_mels)
    for frames in (3000, 1200, 250):
        window = np.ascontiguousarray(pad_or_trim(mel, 3000)[None, :, :frames])
        with torch.no_grad():
            want = exact(torch.from_numpy(window)).numpy()
        ours = fused_base.own_encoder(window)
        theirs = np.array(fused_base.model.encode(
            __import__("ctranslate2").StorageView.from_array(window)))
        assert ours.shape == want.shape == (1, frames // 2, 512)
        scale = np.abs(want).mean()
        ours_err, ct2_err = (np.abs(x - want).mean() / scale for x in (ours, theirs))
        assert ours_err < 0.08 and ours_err <= ct2_err * 1.05, (frames, ours_err, ct2_err)


def test_a_window_is_encoded_the_same_alone_and_in_a_batch(fused_base, clips):
    mels = [pad_or_trim(log_mel_spectrogram(load_audio(clips[n].audio), fused_base.n_mels),
                        800) for n in ("beckett", "clone-test")]
    both = fused_base.own_encoder(np.stack(mels))
    for i, mel in enumerate(mels):
        np.testing.assert_array_equal(both[i], fused_base.own_encoder(mel[None])[0])


def test_real_speech_through_the_fused_encoder(fused_base, clips):
    for name in ("two_cities", "beckett", "clone-test"):
        result = fused_base.transcribe(clips[name].audio, TranscribeOptions(window_pad=2.0))
        assert wer(clips[name].reference, result.text) <= 0.05, (name, result.text)


def test_bad_windows_are_refused_in_one_line(fused_base):
    for bad in ((1, 80, 3002), (80, 100), (1, 128, 100), (1, 80, 0)):  # too long, no batch,
        with pytest.raises(ValueError, match="80 mels, 1..3000 frames"):  # large-v3 mels, empty
            fused_base.own_encoder(np.zeros(bad, np.float32))
    for x in (np.zeros((1, 10, 500), np.float32), np.zeros((1, 10, 512))):  # width, dtype
        with pytest.raises(ValueError, match="encoder_forward_: x must be"):
            kernels.encoder_forward_(x, 8, fused_base.own_encoder.params)


def test_auto_sends_long_windows_to_the_fused_encoder_only_where_vnni_pays(clips):
    """On a VNNI CPU, "auto" encodes windows of FUSED_MIN_FRAMES and more on the fused encoder
    and shorter ones on CTranslate2 (each output compared with the encoder that should have
    made it); with VNNI switched off (the AVX2 path, 0.4-0.6x CT2) every window stays on
    CTranslate2, and so does a process without the kernels - checked in child processes, so
    every branch runs on any VNNI machine."""
    import ctranslate2

    from audiofast.asr.ct2_runtime import FUSED_MIN_FRAMES, fused_encoder_pays

    auto = CT2Whisper("whisper-base", threads=2, encoder="auto")
    if not fused_encoder_pays():
        assert auto.own_encoder is None
        pytest.skip("no AVX-512 VNNI here: auto is CTranslate2 only (asserted)")
    mel = log_mel_spectrogram(load_audio(clips["endgame_nagg_nell"].audio), auto.n_mels)
    for frames in (3000, FUSED_MIN_FRAMES, FUSED_MIN_FRAMES // 2):
        window = np.ascontiguousarray(pad_or_trim(mel, 3000)[None, :, :frames])
        got = np.array(auto.encode_batch(window))
        fused = frames >= FUSED_MIN_FRAMES
        want = auto.own_encoder(window) if fused else np.array(
            auto.model.encode(ctranslate2.StorageView.from_array(window)))
        np.testing.assert_array_equal(got, want, err_msg=f"{frames} frames, fused={fused}")
    import subprocess
    import sys

    for switch in ({"AUDIOFAST_NO_VNNI": "1"}, {"AUDIOFAST_KERNELS": "none"}):  # no kernels
        child = subprocess.run(
            [sys.executable, "-c", "from audiofast.asr.ct2_runtime import CT2Whisper\n"
             "m = CT2Whisper('whisper-base', threads=2, encoder='auto')\n"
             "print(type(m.own_encoder).__name__)"],
            capture_output=True, text=True, env={**__import__("os").environ, **switch},
            check=True)
        assert child.stdout.strip() == "NoneType", (switch, child.stdout + child.stderr)
