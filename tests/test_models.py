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
