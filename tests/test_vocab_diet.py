"""Vocab diet: token selection, exact slicing, re-spelling, export, and Qwen3-ASR's path."""

import numpy as np
import pytest
import torch

from audiofast.asr.ct2_runtime import CT2Whisper
from audiofast.asr.engine import WhisperDecoderEngine
from audiofast.asr.fast_runtime import FastWhisper
from audiofast.asr.options import TranscribeOptions
from audiofast.asr.vocab_diet import (
    DietVocab,
    byte_level_alphabet,
    kd_loss,
    select_tokens,
    slice_vocab,
    whisper_always_kept,
)
from audiofast.asr.vocab_diet_export import export_diet_whisper
from audiofast.models.ct2_to_hf import whisper_from_ct2


def _diet_for(runtime: CT2Whisper, texts: list[str], keep: int,
              extra: tuple[int, ...] = ()) -> DietVocab:
    tokenizer_json = runtime.resolved.ct2_dir / "tokenizer.json"
    full = whisper_from_ct2(runtime.resolved.ct2_dir)[0].config.vocab_size
    always = [*whisper_always_kept(tokenizer_json, runtime.tokenizer.eot, full), *extra]
    vocab = DietVocab(select_tokens(texts, runtime.tokenizer.encode, keep, full, always), full)
    vocab.attach_tokenizer(tokenizer_json)
    return vocab


def test_selection_keeps_specials_bytes_and_the_most_frequent(tiny):
    texts = ["the cat sat on the mat", "the dog sat"]
    vocab = _diet_for(tiny, texts, keep=2000)
    tok = tiny.tokenizer
    assert len(vocab.kept) == 2000 and vocab.kept == sorted(vocab.kept)
    assert set(range(tok.eot, vocab.full_size)) <= vocab.kept_set  # specials + timestamps
    assert len(byte_level_alphabet()) == 256
    for word in (" the", " cat", " sat"):
        assert tok.encode(word)[0] in vocab.kept_set
    with pytest.raises(ValueError, match="below the"):
        _diet_for(tiny, texts, keep=100)
    with pytest.raises(ValueError, match="ascending"):
        DietVocab([5, 3], 10)


def test_unused_tokens_in_the_corpus_alphabet_go_before_other_scripts(tiny):
    """Past the corpus's own tokens, a diet keeps what its alphabet can write: on the real
    vocabulary, tokens of its letters the corpus never used outrank lower ids of others."""
    tok = tiny.tokenizer
    texts = ["the cat sat on the mat"]
    full = whisper_from_ct2(tiny.resolved.ct2_dir)[0].config.vocab_size
    always = whisper_always_kept(tiny.resolved.ct2_dir / "tokenizer.json", tok.eot, full)
    by_id = select_tokens(texts, tok.encode, 6000, full, always)
    by_alphabet = select_tokens(texts, tok.encode, 6000, full, always,
                                token_text=lambda i: tok.decode([i]))
    assert len(by_id) == len(by_alphabet) == 6000
    used = set(tok.encode(" the cat sat on the mat")) | set(tok.encode("the cat sat on the mat"))
    assert used <= set(by_alphabet) and used <= set(by_id)
    alphabet = set("".join(texts)) | {" "}
    writable = {i for i in range(tok.eot) if tok.decode([i]) and set(tok.decode([i])) <= alphabet}
    assert 100 < len(writable) < 6000 - len(always) - len(used)  # all fit: all must be kept
    assert writable <= set(by_alphabet)
    assert not writable <= set(by_id)  # by id alone, lower ids of any script came first


def test_dropped_tokens_are_respelled_with_kept_ones(tiny):
    vocab = _diet_for(tiny, ["plain words only"], keep=2000)
    tok = tiny.tokenizer
    ids = tok.encode(" Incredulity, schizophrenia and the epoch of belief.")
    assert not set(ids) <= vocab.kept_set  # the test needs dropped tokens
    spelled = vocab.encode(ids)
    assert set(spelled) <= vocab.kept_set
    assert tok.decode(spelled) == tok.decode(ids)
    assert len(spelled) > len(ids)
    with pytest.raises(KeyError, match="not in the diet"):
        vocab.map_ids(ids)


def test_teacher_is_distilled_only_at_kept_tokens(tiny):
    """kd_kept_only: the label positions of a re-spelled word's pieces carry no KL (the
    teacher wanted the dropped token there), every kept token's position does; with no such
    position the loss is the cross-entropy alone."""
    from audiofast.distill.asr import Example, _batch, teacher_knows

    vocab = _diet_for(tiny, ["plain words only"], keep=2000)
    tok = tiny.tokenizer
    prompt = tok.sot_sequence("en", "transcribe", timestamps=True)
    target = [*tok.encode(" the schizophrenia and the"), tok.eot]
    example = Example(torch.zeros(4, 8), prompt, target, "")
    index = torch.tensor([0])
    _, inputs, labels = _batch([example], index, vocab.encode)
    knows = teacher_knows([example], index, vocab, labels.shape)[0]
    at = len(prompt) - 1
    pieces = [len(vocab.split(t)) for t in target]
    assert pieces[0] == 1 and max(pieces) > 1  # " the" kept, "schizophrenia" re-spelled
    expected = [n == 1 for n in pieces for _ in range(n)]
    assert knows[at:at + len(expected)].tolist() == expected
    assert not knows[:at].any() and (labels[0, at:at + len(expected)] != -100).all()

    logits = torch.randn(1, labels.shape[1], 7)
    targets = torch.where(labels >= 0, labels % 7, -100)
    teacher = torch.randn(1, labels.shape[1], 7)
    ce = torch.nn.functional.cross_entropy(logits[targets != -100], targets[targets != -100])
    none = torch.zeros_like(knows)[None]
    assert torch.allclose(kd_loss(logits, teacher, targets, teacher_knows=none), ce)
    assert not torch.allclose(kd_loss(logits, teacher, targets, teacher_knows=knows[None]),
                              kd_loss(logits, teacher, targets))


def test_sliced_logits_equal_the_full_models_at_kept_ids(tiny):
    vocab = _diet_for(tiny, ["It was the best of times"], keep=3000)
    full, _ = whisper_from_ct2(tiny.resolved.ct2_dir)
    diet = slice_vocab(whisper_from_ct2(tiny.resolved.ct2_dir)[0], vocab)
    assert diet.config.vocab_size == 3000
    assert diet.proj_out.weight is diet.model.decoder.embed_tokens.weight  # still tied
    assert diet.config.decoder_start_token_id == int(vocab.to_diet[tiny.tokenizer.sot])
    a, b = WhisperDecoderEngine(full, "fp32"), WhisperDecoderEngine(diet, "fp32", vocab)
    encoded = torch.randn(1500, full.config.d_model).numpy()
    a.set_audio(encoded)
    b.set_audio(encoded)
    tokens = torch.tensor([tiny.tokenizer.sot, tiny.tokenizer.timestamp_begin,
                           *tiny.tokenizer.encode(" It was the best")])
    la, lb = a(tokens.numpy(), 0), b(tokens.numpy(), 0)
    kept = vocab.kept_ids
    assert np.allclose(la[:, kept], lb[:, kept], atol=1e-4)
    assert np.isinf(lb).sum() == len(tokens) * (vocab.full_size - len(kept))
    # Drafts are cut before the first token the diet dropped (it could never be emitted).
    dropped = next(i for i in range(vocab.full_size) if i not in vocab.kept_set)
    assert b.known_prefix([*tokens.tolist(), dropped, 440]) == len(tokens)
    assert a.known_prefix([dropped, 440]) == 2
    with pytest.raises(KeyError, match="outside the diet"):
        b([dropped], 0)


def test_export_transcribes_like_the_full_model_when_it_keeps_its_tokens(tiny, clips, tmp_path):
    """A diet that keeps every token the full model emits on a clip must give the same greedy
    transcript (fp32 engine): slicing changes nothing else. The CT2 export runs too."""
    clip = clips["beckett"]
    full = FastWhisper("whisper-tiny.en", threads=2, precision="fp32").transcribe(clip.audio)
    full_text = full.text
    emitted = tuple(t for s in full.segments for t in s.tokens)
    vocab = _diet_for(tiny, [], keep=2500, extra=emitted)
    diet = slice_vocab(whisper_from_ct2(tiny.resolved.ct2_dir)[0], vocab)
    out = export_diet_whisper(diet, vocab, tiny.resolved.ct2_dir, tmp_path / "diet",
                              tiny.tokenizer.timestamp_begin)
    assert {p.name for p in out.iterdir()} >= {"model.bin", "vocab_map.json", "hf"}
    fast = FastWhisper(str(out), threads=2, precision="fp32")
    assert fast.engine.embed.shape[0] == 2500
    assert fast.transcribe(clip.audio).text == full_text
    # A prompt with dropped tokens is re-spelled, not an error.
    prompted = TranscribeOptions(initial_prompt="Incredulity and schizophrenia.")
    assert fast.transcribe(clip.audio, prompted).text.strip()
    ct2_text = CT2Whisper(str(out), threads=2).transcribe(clip.audio, TranscribeOptions()).text
    assert ct2_text.split()[-2:] == full_text.split()[-2:]  # int8 re-quantized: same ending
    # The OpenVINO export converts the folder back to PyTorch for its encoder: the original
    # pad id (50256) is past the diet's 2500 rows, which used to fail an assertion in there.
    back, _ = whisper_from_ct2(out)
    assert back.config.vocab_size == 2500 and back.config.pad_token_id is None


def test_ct2_diet_export_needs_a_language_for_multilingual(base, tmp_path):
    vocab = _diet_for(base, ["hello there"], keep=2200)
    diet = slice_vocab(whisper_from_ct2(base.resolved.ct2_dir)[0], vocab)
    out = export_diet_whisper(diet, vocab, base.resolved.ct2_dir, tmp_path / "diet",
                              base.tokenizer.timestamp_begin)
    runtime = CT2Whisper(str(out), threads=2)
    assert runtime.tokenizer.multilingual  # judged by the original vocabulary, not CT2's
    with pytest.raises(ValueError, match="pass --language"):
        runtime.detect_language(runtime.encode(torch.zeros(80, 3000)))


def _tiny_qwen3_asr():
    from transformers import Qwen3ASRConfig, Qwen3ASRForConditionalGeneration

    torch.manual_seed(0)
    config = Qwen3ASRConfig(
        audio_config=dict(num_mel_bins=16, encoder_layers=1, encoder_attention_heads=2,
                          encoder_ffn_dim=32, d_model=16, output_dim=32, n_window=4,
                          n_window_infer=16, downsample_hidden_size=8),
        text_config=dict(vocab_size=151936, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=16, tie_word_embeddings=True),
    )
    return Qwen3ASRForConditionalGeneration(config).eval()


def test_qwen3_asr_diet_slices_and_recovers(tmp_path):
    """The headline case: Qwen3-ASR's 152k vocabulary through the same code (tiny random
    config: its weights are not available here)."""
    from transformers import Qwen3ASRForConditionalGeneration

    teacher = _tiny_qwen3_asr()
    full_size = teacher.config.text_config.vocab_size
    specials = range(151643, full_size)  # Qwen's added tokens (audio, timestamps, chat)
    texts = [" ".join(str(i) for i in range(j, j + 20)) for j in range(50)]
    encode = lambda text: [int(w) * 7 % 150000 for w in text.split()]  # noqa: E731
    kept = select_tokens(texts, encode, 4096, full_size, [*range(256), *specials])
    vocab = DietVocab(kept, full_size)
    student = slice_vocab(_tiny_qwen3_asr(), vocab)
    assert student.config.text_config.vocab_size == 4096
    assert student.config.audio_token_id == int(vocab.to_diet[151676])
    assert student.lm_head.weight is student.get_input_embeddings().weight

    ids = torch.tensor([kept[300:340]])
    to_diet, kept_ids = torch.from_numpy(vocab.to_diet), torch.from_numpy(vocab.kept_ids)
    with torch.no_grad():
        full_logits = teacher(input_ids=ids).logits
        diet_logits = student(input_ids=to_diet[ids]).logits
    assert torch.allclose(full_logits[..., kept_ids], diet_logits, atol=1e-5)

    # Recovery: a few KD steps towards a sharper teacher lower the loss.
    targets = to_diet[ids[:, 1:]]
    teacher_logits = 3 * full_logits[:, :-1, kept_ids]
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        logits = student(input_ids=to_diet[ids[:, :-1]]).logits
        loss = kd_loss(logits, teacher_logits, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]

    student.save_pretrained(tmp_path / "qwen-diet")
    vocab.save(tmp_path / "qwen-diet" / "vocab_map.json")
    again = Qwen3ASRForConditionalGeneration.from_pretrained(tmp_path / "qwen-diet")
    assert again.get_input_embeddings().num_embeddings == 4096
    assert DietVocab.load(tmp_path / "qwen-diet" / "vocab_map.json").kept == kept


def test_varied_corpus_voices_speak_and_its_augmentations_change_the_audio():
    """Every voice of the varied recovery corpus synthesizes here (a typo or a missing voice
    would fail only hours into a run) and every augmentation changes the clip it is given."""
    from audiofast.audio import load_audio
    from audiofast.distill.asr import CORPORA
    from audiofast.eval.augment import apply
    from audiofast.eval.tts import synthesize

    voices, augmentations = CORPORA["varied"]
    assert len(set(voices)) == len(voices) >= 8 and len(set(augmentations) - {None}) >= 4
    spoken = {voice: load_audio(synthesize("Recovery needs many voices.", voice))
              for voice in voices}
    assert all(len(audio) > 8000 for audio in spoken.values())
    durations = {voice: len(audio) for voice, audio in spoken.items()}
    assert durations["piper:joe@rate=0.85"] > durations["piper:joe"] > durations[
        "piper:joe@rate=1.15"]  # rates reach the synthesizer
    audio = spoken["flite:slt"]
    for spec in filter(None, augmentations):
        changed = apply(audio, spec, seed=1)
        assert changed.shape == audio.shape and not np.allclose(changed, audio), spec


def test_corpus_is_refused_where_no_stage_reads_it():
    from audiofast.cli import main

    with pytest.raises(SystemExit, match="--corpus is for --stage vocab and --stage qad"):
        main(["distill", "--stage", "drafter", "--corpus", "varied"])
