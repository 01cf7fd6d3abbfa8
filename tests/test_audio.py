import subprocess

import numpy as np
import pytest
import torch

from audiofast.asr.features import N_FRAMES, log_mel_spectrogram, pad_or_trim
from audiofast.audio import SAMPLE_RATE, AudioError, load_audio
from tests.conftest import convert


@pytest.fixture(scope="module")
def reference(clips):
    """The beckett clip decoded straight to 16 kHz: what every other encoding must match."""
    return load_audio(clips["beckett"].audio)


@pytest.mark.parametrize("suffix", ["wav", "mp3", "flac"])
@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_decodes_stereo_files_at_any_rate(tmp_path, ffmpeg, clips, reference, suffix, rate):
    path = convert(ffmpeg, clips["beckett"].audio, tmp_path / f"clip.{suffix}", rate, 2)
    audio = load_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    # mp3 adds encoder delay/padding: allow 60 ms; wav/flac must agree to 5 ms.
    slack = 0.06 if suffix == "mp3" else 0.005
    assert abs(len(audio) - len(reference)) <= slack * SAMPLE_RATE
    # Same speech, not just the same length: high correlation with the reference (8 kHz
    # keeps only the band below 4 kHz, so it is compared with a lower bar).
    n = min(len(audio), len(reference))
    lag = int(np.argmax(np.correlate(audio[:16000], reference[:16000] * 1.0, "full"))) - 15999
    if lag >= 0:
        a, b = audio[lag:n], reference[: n - lag]
    else:
        a, b = audio[: n + lag], reference[-lag:n]
    corr = float(np.corrcoef(a, b)[0, 1])
    assert corr > (0.7 if rate == 8000 else 0.95), corr


def test_stereo_is_downmixed_not_one_channel(tmp_path, ffmpeg):
    """Left = tone, right = silence: a mean downmix keeps the tone at half amplitude."""
    path = tmp_path / "lr.wav"
    subprocess.run(
        [ffmpeg, "-loglevel", "error", "-y", "-f", "lavfi", "-i", "sine=f=440:d=1:r=16000",
         "-f", "lavfi", "-i", "anullsrc=r=16000:cl=mono", "-filter_complex",
         "[0:a][1:a]join=inputs=2:channel_layout=stereo[a]", "-map", "[a]", "-t", "1",
         str(path)],
        check=True,
    )
    audio = load_audio(path)
    assert 0.05 < np.abs(audio).max() < 0.1  # ffmpeg's sine is 1/8 full scale; halved ~0.0625


def test_arrays_pass_through_and_are_downmixed():
    stereo = np.stack([np.ones(100), np.zeros(100)]).astype(np.float32)
    assert np.allclose(load_audio(stereo), 0.5)
    assert load_audio(torch.zeros(10)).shape == (10,)


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.wav", "no such file"),
        (lambda d: _write(d / "empty.wav", b""), "empty file"),
        (lambda d: _write(d / "notes.txt", b"hello " * 50), "cannot decode audio"),
        (lambda d: _write(d / "noise.wav", bytes(range(256)) * 8), "cannot decode audio"),
        (lambda d: d, "is a directory"),
    ],
)
def test_bad_files_give_one_line_errors(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(AudioError, match=message) as info:
        load_audio(path)
    assert "\n" not in str(info.value)


def test_video_without_audio_is_rejected(tmp_path, ffmpeg):
    path = tmp_path / "video.mp4"
    subprocess.run([ffmpeg, "-loglevel", "error", "-y", "-f", "lavfi", "-i",
                    "testsrc=duration=1:size=32x32", str(path)], check=True)
    with pytest.raises(AudioError, match="no audio stream"):
        load_audio(path)


def test_bad_arrays_are_rejected():
    with pytest.raises(AudioError, match="no samples"):
        load_audio(np.zeros(0, dtype=np.float32))
    with pytest.raises(AudioError, match="NaN"):
        load_audio(np.array([0.0, np.nan], dtype=np.float32))
    with pytest.raises(AudioError, match="1-D"):
        load_audio(np.zeros((2, 2, 2), dtype=np.float32))
    with pytest.raises(AudioError, match="empty input"):
        load_audio(b"")


def test_bytes_decode_like_the_file(clips, reference):
    assert np.allclose(load_audio(clips["beckett"].audio.read_bytes()), reference)


def test_log_mel_matches_transformers_feature_extractor(reference):
    from transformers import WhisperFeatureExtractor

    expected = WhisperFeatureExtractor(feature_size=80)(
        reference, sampling_rate=SAMPLE_RATE, return_tensors="np"
    ).input_features[0]
    # Whisper pads the audio to 30 s with zeros before the STFT.
    ours = log_mel_spectrogram(reference, 80, padding=N_FRAMES * 160 - len(reference))
    assert np.abs(pad_or_trim(ours) - expected).max() < 1e-4


def test_log_mel_matches_torch_stft_and_torchaudio_filterbank(reference):
    """The numpy front end against torch's STFT and torchaudio's Slaney filterbank (the
    implementation it replaced), on real speech with 30 s of padding as longform.py uses."""
    import torchaudio

    from audiofast.asr.features import mel_filters

    for n_mels in (80, 128):
        bank = torchaudio.functional.melscale_fbanks(
            n_freqs=201, f_min=0.0, f_max=8000.0, n_mels=n_mels, sample_rate=SAMPLE_RATE,
            norm="slaney", mel_scale="slaney").T
        assert np.abs(mel_filters(n_mels) - bank.numpy()).max() < 1e-6
    audio = torch.nn.functional.pad(torch.from_numpy(reference), (0, 480_000))
    stft = torch.stft(audio, 400, 160, window=torch.hann_window(400), return_complex=True)
    power = stft[..., :-1].abs() ** 2
    bank = torchaudio.functional.melscale_fbanks(201, 0.0, 8000.0, 80, SAMPLE_RATE,
                                                 norm="slaney", mel_scale="slaney").T
    log_spec = torch.clamp(bank @ power, min=1e-10).log10()
    expected = ((torch.maximum(log_spec, log_spec.max() - 8.0) + 4.0) / 4.0).numpy()
    ours = log_mel_spectrogram(reference, 80, padding=480_000)
    assert ours.dtype == np.float32 and ours.shape == expected.shape
    assert np.abs(ours - expected).max() < 5e-5  # float32 rounding (values are ~1)


@pytest.mark.parametrize(("suffix", "rate", "channels"), [("flac", 44100, 2), ("mp3", 48000, 1),
                                                          ("ogg", 22050, 2)])
def test_ffmpeg_path_gives_torchcodecs_samples(tmp_path, ffmpeg, clips, suffix, rate, channels):
    """Files that need resampling or a downmix go through PyAV (ffmpeg); torchcodec (also
    ffmpeg, the decoder this replaced) must give the same samples."""
    from torchcodec.decoders import AudioDecoder

    path = convert(ffmpeg, clips["beckett"].audio, tmp_path / f"clip.{suffix}", rate, channels)
    expected = AudioDecoder(str(path), sample_rate=16_000, num_channels=1).get_all_samples()
    ours = load_audio(path)
    assert ours.shape == (expected.data.shape[-1],)
    assert np.abs(ours - expected.data.reshape(-1).numpy()).max() < 1e-6


@pytest.mark.parametrize("suffix", [".wav", ".flac"])
def test_16k_mono_pcm_is_read_without_ffmpeg_and_identically(tmp_path, clips, suffix):
    """A file already in Whisper's format skips ffmpeg: the samples are exactly ffmpeg's
    (torchcodec's), and neither PyAV nor torch is imported."""
    import subprocess
    import sys

    import soundfile
    from torchcodec.decoders import AudioDecoder

    pcm, rate = soundfile.read(str(clips["beckett"].audio), dtype="int16")
    assert rate == 16_000
    path = tmp_path / f"clip{suffix}"
    soundfile.write(str(path), pcm, rate, subtype="PCM_16")
    ffmpeg = AudioDecoder(str(path), sample_rate=16_000, num_channels=1).get_all_samples()
    assert np.array_equal(load_audio(path), ffmpeg.data.reshape(-1).numpy())
    code = ("import sys\nfrom audiofast.audio import load_audio\nload_audio(sys.argv[1])\n"
            "print(sorted({'av', 'torch', 'torchcodec'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "[]"


def test_mel_runs_numpys_blas_on_one_thread_and_gives_its_threads_back(monkeypatch):
    """OpenBLAS's spinning threads slowed the encoder and decoder beside them (blas.py): the
    filterbank matmul runs on one, and the count is restored after."""
    from threadpoolctl import threadpool_info

    import audiofast.asr.features as features

    def blas_threads() -> int:
        return max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")

    before = blas_threads()
    if before < 2:
        pytest.skip("numpy's BLAS has one thread here: holding it to one cannot be told apart")
    seen = []
    filters = features.mel_filters

    def spy(n_mels):
        seen.append(blas_threads())
        return filters(n_mels)

    monkeypatch.setattr(features, "mel_filters", spy)
    features.log_mel_spectrogram(np.zeros(SAMPLE_RATE, np.float32))
    assert seen == [1]
    assert blas_threads() == before


def test_one_blas_thread_held_by_two_threads_is_restored_by_the_last_to_leave():
    """The live server computes mels and fused encoder calls in two threads at once: while
    either is inside, BLAS stays on one thread, and once both have left it has what it had
    before (each holding its own limit restored the other's, and left one thread for good)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from audiofast.asr.blas import one_blas_thread

    def blas_threads() -> int:
        return max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")

    with threadpool_limits(limits=2, user_api="blas"):
        if blas_threads() != 2:
            pytest.skip("numpy's BLAS cannot run two threads here: nothing to restore")
        first, second = one_blas_thread(), one_blas_thread()
        first.__enter__()
        second.__enter__()  # the second thread enters while the first is inside
        first.__exit__(None, None, None)
        inside = blas_threads()
        second.__exit__(None, None, None)
        assert (inside, blas_threads()) == (1, 2)
