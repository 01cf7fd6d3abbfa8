"""Is a short utterance heard better with the audio around it? (the live WER gap's cause)

    python evals/utterance_context.py --context 0 4 10 20 --dialogues 8
    python evals/utterance_context.py --context 8 --after 0 0.5 1 2   # lookahead

Offline, no live policy: each clip (endgame and the TTS dialogues of stream_quality.py) is cut
into utterances by the live server's VAD, with its pre- and post-roll. Each utterance is then
transcribed (the offline runtime, default options, the earlier utterances' text as the
prompt) alone, or from ``--context`` seconds earlier (and to ``--after`` seconds past its end:
what a close that waited for more audio would hear), keeping the words whose aligned middle
falls in the utterance. Printed: WER of the joined utterances per clip and the mean, beside
transcribing the whole clip at once.
"""

from __future__ import annotations

import argparse

import numpy as np
from stream_quality import dialogues  # evals/ is on the path when run as a script

from audiofast.asr.options import TranscribeOptions
from audiofast.asr.runtime import load_model
from audiofast.audio import SAMPLE_RATE, load_audio
from audiofast.eval.datasets import real_speech_clips
from audiofast.eval.wer import wer
from audiofast.stream.session import StreamOptions
from audiofast.stream.vad import SpeechDetector


def utterance_buffers(audio: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) samples of each VAD utterance as the live session buffers it."""
    options, detector = StreamOptions(), SpeechDetector()
    events = detector.feed(audio) + detector.flush()
    starts = [e.sample for e in events if e.kind == "start"]
    ends = [e.sample for e in events if e.kind == "end"]
    buffers, floor = [], 0
    for start, end in zip(starts, ends, strict=True):
        begin = max(start - int(options.pre_roll_s * SAMPLE_RATE), floor)
        floor = min(end + int(options.post_roll_s * SAMPLE_RATE), len(audio))
        buffers.append((begin, floor))
    return buffers


def transcribe_utterances(runtime, audio: np.ndarray, context_s: float,
                          after_s: float = 0.0) -> str:
    texts: list[str] = []
    for begin, end in utterance_buffers(audio):
        start = max(0, begin - int(context_s * SAMPLE_RATE))
        stop = min(len(audio), end + int(after_s * SAMPLE_RATE))
        prompt = " ".join(texts)[-200:] or None
        options = TranscribeOptions(initial_prompt=prompt, condition_on_previous_text=False,
                                    word_timestamps=True)
        result = runtime.transcribe(audio[start:stop], options)
        cut, until = (begin - start) / SAMPLE_RATE, (end - start) / SAMPLE_RATE
        texts.append("".join(w.word for s in result.segments for w in (s.words or [])
                             if cut <= (w.start + w.end) / 2 < until).strip())
    return " ".join(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="whisper-base")
    parser.add_argument("--context", nargs="+", type=float, default=[0.0, 10.0])
    parser.add_argument("--after", nargs="+", type=float, default=[0.0],
                        help="seconds of audio past each utterance's end it is decoded with")
    parser.add_argument("--dialogues", type=int, default=8)
    parser.add_argument("--long-lines", type=int, default=0,
                        help="dialogues of three-sentence lines (stream_quality.py's)")
    parser.add_argument("--real", nargs="*", default=["endgame_nagg_nell"],
                        help="recordings by name, 'all' for every one")
    args = parser.parse_args()
    runtime = load_model(args.model, threads=2)
    clips = [{"name": c.name, "audio": load_audio(c.audio), "reference": c.reference}
             for c in real_speech_clips() if "all" in args.real or c.name in args.real]
    clips += dialogues(args.dialogues)
    if args.long_lines:
        clips += dialogues(args.long_lines, lines=4, seed=1, sentences=3, words=(6, 12),
                           name="long")
    settings = [(c, a) for c in args.context for a in args.after]
    name = {(c, a): f"context {c:g} s" + (f", after {a:g} s" if a else "") for c, a in settings}
    rows = {name[s]: [] for s in settings} | {"whole clip": []}
    for clip in clips:
        for context, after in settings:
            text = transcribe_utterances(runtime, clip["audio"], context, after)
            rows[name[context, after]].append(wer(clip["reference"], text))
        rows["whole clip"].append(wer(clip["reference"], runtime.transcribe(clip["audio"]).text))
    print("| utterances decoded | " + " | ".join(c["name"] for c in clips) + " | mean |")
    print("|---" * (len(clips) + 2) + "|")
    for name, values in rows.items():
        print(f"| {name} | " + " | ".join(f"{v:.3f}" for v in values)
              + f" | {np.mean(values):.3f} |")


if __name__ == "__main__":
    main()
