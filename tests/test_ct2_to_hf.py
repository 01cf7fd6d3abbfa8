"""The PyTorch Whisper read from CTranslate2's model.bin is the same network."""

import struct

import ctranslate2
import numpy as np
import pytest
import torch

from audiofast.asr.features import log_mel_spectrogram, pad_or_trim
from audiofast.asr.tokenizer import WhisperTokenizer
from audiofast.audio import load_audio
from audiofast.eval.wer import wer
from audiofast.models import packaged_model_dir
from audiofast.models.ct2_reader import CT2FormatError, read_ct2_model
from audiofast.models.ct2_to_hf import whisper_from_ct2


@pytest.fixture(scope="module", params=["whisper-tiny.en", "whisper-base"])
def pair(request):
    ct2_dir = packaged_model_dir(request.param)
    hf, processor = whisper_from_ct2(ct2_dir)
    ct2 = ctranslate2.models.Whisper(str(ct2_dir), compute_type="float32", intra_threads=2)
    return request.param, ct2_dir, hf, processor, ct2


def _features(path) -> torch.Tensor:
    audio = load_audio(path)
    mel = log_mel_spectrogram(audio, 80, padding=480_000)[:, : len(audio) // 160]
    return torch.from_numpy(pad_or_trim(mel)[None])


@pytest.mark.parametrize("clip", ["beckett", "clone-test"])
def test_encoder_matches_ctranslate2(pair, clips, clip):
    """fp32 on both sides; CT2 and PyTorch differ in GEMM blocking and fused kernels, so the
    outputs agree to float32 rounding accumulated over the layers: at most 1e-3 relative to the
    largest activation, far below anything that changes a token."""
    _, _, hf, _, ct2 = pair
    mel = _features(clips[clip].audio)
    with torch.no_grad():
        ours = hf.model.encoder(mel).last_hidden_state.numpy()
    theirs = np.array(ct2.encode(ctranslate2.StorageView.from_array(mel.numpy().copy())))
    assert ours.shape == theirs.shape
    assert np.abs(ours - theirs).max() / np.abs(theirs).max() < 1e-3


@pytest.mark.parametrize("clip", ["beckett", "clone-test"])
def test_greedy_transcripts_agree(pair, clips, clip):
    name, ct2_dir, hf, processor, ct2 = pair
    tok = WhisperTokenizer.from_dir(ct2_dir, multilingual=name == "whisper-base")
    prompt = tok.sot_sequence("en", "transcribe", timestamps=False)
    mel = _features(clips[clip].audio)
    theirs = ct2.generate(
        ctranslate2.StorageView.from_array(mel.numpy().copy()), [prompt], beam_size=1,
        suppress_tokens=[-1],
    )[0].sequences_ids[0]
    ours = _greedy(hf, mel, prompt, tok.eot)
    assert ours == theirs, (processor.decode(ours), tok.decode(theirs))


def _greedy(hf, mel: torch.Tensor, prompt: list[int], eot: int, limit: int = 100) -> list[int]:
    """Plain greedy decoding on the PyTorch model, with its KV cache. Only the model is under
    test here, not transformers' generation policy, so the loop is written out."""
    with torch.no_grad():
        encoded = hf.model.encoder(mel).last_hidden_state
        ids, past, tokens = torch.tensor([prompt]), None, []
        for _ in range(limit):
            out = hf(encoder_outputs=(encoded,), decoder_input_ids=ids, past_key_values=past,
                     use_cache=True)
            logits = out.logits[0, -1]
            logits[hf.generation_config.suppress_tokens] = -np.inf
            if not tokens:
                logits[hf.generation_config.begin_suppress_tokens] = -np.inf
            token = int(logits.argmax())
            if token == eot:
                break
            tokens.append(token)
            ids, past = torch.tensor([[token]]), out.past_key_values
    return tokens


def test_hf_generate_transcribes(pair, clips):
    """transformers' own ``generate`` works on the converted model (multilingual prompt set)."""
    name, _, hf, processor, _ = pair
    kwargs = {"language": "en", "task": "transcribe"} if name == "whisper-base" else {}
    ids = hf.generate(_features(clips["beckett"].audio), **kwargs)[0]
    text = processor.decode(ids, skip_special_tokens=True)
    assert wer(clips["beckett"].reference, text) <= 0.2, text


def test_config_and_tied_head(pair):
    name, _, hf, _, _ = pair
    cfg = hf.config
    expected = {"whisper-tiny.en": (384, 4, 6, 51864), "whisper-base": (512, 6, 8, 51865)}[name]
    got = (cfg.d_model, cfg.encoder_layers, cfg.encoder_attention_heads, cfg.vocab_size)
    assert got == expected
    assert hf.proj_out.weight.data_ptr() == hf.model.decoder.embed_tokens.weight.data_ptr()


def test_reader_rejects_truncated_and_foreign_files(tmp_path):
    src = packaged_model_dir("whisper-tiny.en") / "model.bin"
    truncated = tmp_path / "model.bin"
    truncated.write_bytes(src.read_bytes()[:5000])
    with pytest.raises(CT2FormatError, match="truncated|end of file"):
        read_ct2_model(truncated)
    truncated.write_bytes(struct.pack("<I", 99) + b"junk")
    with pytest.raises(CT2FormatError, match="binary version 99"):
        read_ct2_model(truncated)
    with pytest.raises(FileNotFoundError):
        read_ct2_model(tmp_path / "nothing")
