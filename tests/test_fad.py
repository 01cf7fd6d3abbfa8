"""FAD math against scipy, against fadtk's shipped statistics, and on real degradations."""

import numpy as np
import pytest
import scipy.linalg

from audiofast.eval import augment
from audiofast.eval.fad import Stats, WhisperEmbedder, fad_inf, frechet_distance


def scipy_frechet(a: Stats, b: Stats) -> float:
    """The textbook formula with scipy's general matrix square root (fadtk does the same)."""
    covmean = scipy.linalg.sqrtm(a.cov @ b.cov)
    covmean = covmean.real
    diff = a.mu - b.mu
    return float(diff @ diff + np.trace(a.cov) + np.trace(b.cov) - 2 * np.trace(covmean))


def _random_stats(rng, dim, n):
    x = rng.standard_normal((n, dim)) @ rng.standard_normal((dim, dim)) * 0.3 + rng.normal(size=dim)
    return Stats.of(x)


def test_frechet_matches_scipy_on_random_gaussians():
    rng = np.random.default_rng(0)
    for dim in (4, 32, 128):
        a, b = _random_stats(rng, dim, 4 * dim), _random_stats(rng, dim, 4 * dim)
        ours, theirs = frechet_distance(a, b), scipy_frechet(a, b)
        assert ours == pytest.approx(theirs, rel=1e-6)
        assert frechet_distance(a, a) == pytest.approx(0.0, abs=1e-8 * np.trace(a.cov))


def test_frechet_on_fadtk_reference_statistics(fadtk_stats):
    """fadtk ships (mu, cov) of FMA pop for many embedders: our distance between two of its
    statistics agrees with scipy's, and a statistic is at distance 0 from itself."""
    names = ["vggish", "encodec-emb", "clap-laion-audio", "MERT-v1-95M-4"]
    for name in names:
        s = Stats.load(fadtk_stats, name)
        assert frechet_distance(s, s) == pytest.approx(0.0, abs=1e-6 * np.trace(s.cov))
    for x, y in [("MERT-v1-95M-4", "MERT-v1-95M-8"), ("encodec-emb", "encodec-emb-48k"),
                 ("clap-laion-audio", "clap-laion-music")]:
        a, b = Stats.load(fadtk_stats, x), Stats.load(fadtk_stats, y)
        assert frechet_distance(a, b) == pytest.approx(scipy_frechet(a, b), rel=1e-5)


def test_fad_inf_extrapolates_bias_away():
    """Samples from the reference Gaussian itself: finite-n FAD is biased upward, FAD-inf
    removes most of the bias."""
    rng = np.random.default_rng(1)
    dim = 16
    ref = Stats(np.zeros(dim), np.eye(dim))
    x = rng.standard_normal((2000, dim))
    biased = frechet_distance(Stats.of(x[:200]), ref)
    assert abs(fad_inf(x, ref)) < biased / 3


@pytest.fixture(scope="module")
def embedder():
    return WhisperEmbedder("whisper-base", threads=2)


def test_fad_zero_for_identical_sets_and_monotonic_in_degradation(embedder, clips):
    clean = [np.asarray(embedder.embed(a)) for a in _speech(clips)]
    ref = Stats.of(np.concatenate(clean))
    assert frechet_distance(Stats.of(np.concatenate(clean)), ref) == pytest.approx(0, abs=1e-6)

    def fad_of(transform):
        emb = [embedder.embed(transform(a)) for a in _speech(clips)]
        return frechet_distance(Stats.of(np.concatenate(emb)), ref)

    for family in (
        [lambda a, s=s: augment.add_noise(a, s) for s in (30, 20, 10, 0)],
        [lambda a, c=c: augment.lowpass(a, c) for c in (6000, 3000, 1500, 700)],
        [lambda a, f=f: augment.time_stretch(a, f) for f in (1.1, 1.3, 1.6)],
    ):
        values = [fad_of(t) for t in family]
        assert all(v > 0 for v in values)
        assert values == sorted(values), values


def _speech(clips):
    from audiofast.audio import load_audio

    names = ("beckett", "clone-test", "endgame_nagg_nell")
    return [load_audio(clips[name].audio) for name in names]


def _write_wav(path, audio: np.ndarray) -> None:
    import wave

    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())


def test_audio_gate_passes_equal_and_rejects_degraded_sets(tmp_path, clips):
    from audiofast.eval.gate import gate_audio, load_config

    speech = _speech(clips)
    for name, transform in [("ref", lambda a: a), ("base", lambda a: augment.add_noise(a, 30)),
                            ("bad", lambda a: augment.add_noise(a, 5))]:
        (tmp_path / name).mkdir()
        for i, a in enumerate(speech):
            _write_wav(tmp_path / name / f"{i}.wav", transform(a))
    config = load_config()
    same = gate_audio(tmp_path / "base", tmp_path / "base", tmp_path / "ref", config)
    assert same.passed and same.checks[0]["value"] == pytest.approx(1.0)
    worse = gate_audio(tmp_path / "bad", tmp_path / "base", tmp_path / "ref", config)
    assert not worse.passed and worse.checks[0]["value"] > 2
    per_clip = worse.details["candidate"]["per_clip"]
    assert set(per_clip) == {"0.wav", "1.wav", "2.wav"}
