"""How much does int4 cost the Whisper decoder, and how much does QAD win back?

    python evals/int4_quality.py --model whisper-base \
        --candidates int8 int8-head4 int4-head8 int4 runs/qad/whisper-base-qad-int4-head8 \
        --out evals/benchmarks/2026-12-02-epyc-avx512-int4

Per candidate decoder (a fused precision of ``--model``, or a QAD or GPTQ export folder at
its own precision or as ``FOLDER@PRECISION``), against the fp32 reference decoder of the same
model, teacher-forced on the same windows and tokens (the CTranslate2 int8 model's greedy
transcripts, timestamps included): mean KL(fp32 || candidate) per token and top-1
agreement, on held-out domain sentences spoken by flite (what QAD trains on, other
sentences) and apart on the four real recordings (first 30 s window each); then real-speech
WER (whole clips, the default options, language en) and decoder ms/token on those
transcriptions (median of ``--runs``). Writes ``<out>.json`` and ``<out>.md``; prints the
table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
from pathlib import Path

import numpy as np

import audiofast  # noqa: F401 - sets GOMP_SPINCOUNT before torch loads libgomp
from audiofast.asr.ct2_runtime import CT2Whisper
from audiofast.asr.decoding import log_softmax
from audiofast.asr.fast_runtime import FastWhisper
from audiofast.asr.features import N_FRAMES, log_mel_spectrogram, pad_or_trim
from audiofast.asr.options import TranscribeOptions
from audiofast.audio import load_audio
from audiofast.distill.asr import build_examples, split_corpus
from audiofast.eval.datasets import domain_corpus, real_speech_clips
from audiofast.eval.wer import wer


def forced_windows(ct2: CT2Whisper, held_sentences: int, workdir: Path) -> dict[str, list]:
    """(encoder output, tokens, where the targets start) per window: held-out TTS, real."""
    tok = ct2.tokenizer
    prompt = tok.sot_sequence("en", "transcribe", timestamps=True)
    _, held = split_corpus(domain_corpus())
    tts = [(e.encoded.float().numpy()[None], e.prompt + e.target, len(e.prompt))
           for e in build_examples(ct2, held[:held_sentences],
                                   cache=workdir / f"held-{held_sentences}.pt")]
    real = []
    for clip in real_speech_clips():
        mel = pad_or_trim(log_mel_spectrogram(load_audio(clip.audio), ct2.n_mels), N_FRAMES)
        encoded = ct2.encode(mel)
        result = ct2.decode(encoded, prompt, TranscribeOptions(language="en"), 0.0)
        real.append((np.array(encoded), [*prompt, *result.tokens, tok.eot], len(prompt)))
    return {"tts": tts, "real": real}


def logprobs(runtime: FastWhisper, encoded: np.ndarray, tokens: list[int], first: int):
    runtime.engine.set_audio(encoded)
    return log_softmax(runtime.engine(np.asarray(tokens), 0)[first - 1 : -1])


def compare(candidate: FastWhisper, reference: dict, windows: dict) -> dict:
    out = {}
    for kind, items in windows.items():
        kls, agree = [], []
        for (encoded, tokens, first), ref in zip(items, reference[kind], strict=True):
            lp = logprobs(candidate, encoded, tokens, first)
            kls.append((np.exp(ref) * (ref - lp)).sum(-1))
            agree.append(lp.argmax(-1) == ref.argmax(-1))
        out[f"kl_{kind}"] = float(np.concatenate(kls).mean())
        out[f"agree_{kind}"] = float(np.concatenate(agree).mean())
    return out


def transcribe_clips(runtime: FastWhisper, runs: int) -> dict:
    clips = real_speech_clips()
    options = TranscribeOptions(language="en")
    texts, per_token = [], []
    for run in range(runs):
        decoder_s = tokens = 0
        for clip in clips:
            result = runtime.transcribe(clip.audio, options, progress=False)
            decoder_s += result.stats["decoder_s"]
            tokens += result.stats["tokens"]
            if run == 0:
                texts.append(result.text)
        per_token.append(1000 * decoder_s / tokens)
    return {"real_wer": wer([c.reference for c in clips], texts),
            "ms_per_token": statistics.median(per_token)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="whisper-base")
    parser.add_argument("--candidates", nargs="+",
                        default=["int8", "int8-head4", "int4-head8", "int4"])
    parser.add_argument("--held-sentences", type=int, default=60)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("runs/int4_quality"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    ct2 = CT2Whisper(args.model, threads=args.threads)
    windows = forced_windows(ct2, args.held_sentences, args.workdir)
    fp32 = FastWhisper(threads=args.threads, precision="fp32", ct2=ct2)
    reference = {kind: [logprobs(fp32, *item) for item in items]
                 for kind, items in windows.items()}
    del fp32
    rows = []
    for name in args.candidates:
        path, _, precision = name.partition("@")
        folder = Path(path)
        if folder.is_dir():  # a QAD or GPTQ export, at its own precision or @PRECISION
            runtime = FastWhisper(str(folder), threads=args.threads, precision=precision or None)
            label = f"{folder.name} @ {runtime.engine.precision}"
        else:
            runtime = FastWhisper(threads=args.threads, precision=name, ct2=ct2)
            label = f"PTQ {name}" if "4" in name else name
        row = {"candidate": label, **compare(runtime, reference, windows),
               **transcribe_clips(runtime, args.runs)}
        rows.append(row)
        print(json.dumps(row))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    base = rows[0]["ms_per_token"]
    lines = [f"# int4 decoder quality ({args.model})", "",
             f"`python evals/int4_quality.py --model {args.model} --candidates "
             f"{' '.join(args.candidates)}` (commit {commit}, {platform.processor() or 'cpu'}, "
             f"{args.threads} threads). KL(fp32 || candidate) per token, teacher-forced; "
             f"TTS = {len(windows['tts'])} windows of held-out domain sentences (flite); real "
             "= the first window of each of the 4 recordings.", "",
             "| decoder | KL TTS | agree TTS | KL real | agree real | real WER % | ms/token "
             "| speed vs first |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['candidate']} | {r['kl_tts']:.5f} | {r['agree_tts']:.4f} | "
                     f"{r['kl_real']:.5f} | {r['agree_real']:.4f} | {100 * r['real_wer']:.2f} "
                     f"| {r['ms_per_token']:.2f} | {base / r['ms_per_token']:.2f}x |")
    table = "\n".join(lines) + "\n"
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"rows": rows, "args": vars(args)},
                                                        indent=2, default=str))
    args.out.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
