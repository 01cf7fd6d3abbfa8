import json
import re
import subprocess
import sys

import pytest

from audiofast.asr.types import Segment, Transcription
from audiofast.asr.writers import FORMATS, format_timestamp, to_srt, to_vtt
from audiofast.eval.wer import normalize, wer

SRT_TIME = r"\d{2}:\d{2}:\d{2},\d{3}"
VTT_TIME = r"(?:\d{2}:)?\d{2}:\d{2}\.\d{3}"


def _seconds(stamp: str) -> float:
    parts = [float(p) for p in stamp.replace(",", ".").split(":")]
    return sum(p * 60**i for i, p in enumerate(reversed(parts)))


def _result() -> Transcription:
    segs = [Segment(i, 0, s, e, f" word {i}", [], -0.1, 1.0, 0.0, 0.0)
            for i, (s, e) in enumerate([(0.0, 1.5), (1.5, 3661.25)])]
    return Transcription(segs, "en", 1.0, 3700.0)


def test_timestamp_formatting():
    assert format_timestamp(0) == "00:00.000"
    assert format_timestamp(3661.25, ",", always_hours=True) == "01:01:01,250"
    assert format_timestamp(59.9996) == "01:00.000"  # rounding carries into the minute
    with pytest.raises(ValueError):
        format_timestamp(-1)


def test_srt_and_vtt_are_well_formed():
    srt = to_srt(_result())
    blocks = srt.strip().split("\n\n")
    assert len(blocks) == 2
    for i, block in enumerate(blocks, start=1):
        index, times, text = block.split("\n")
        assert index == str(i)
        assert re.fullmatch(rf"{SRT_TIME} --> {SRT_TIME}", times)
        assert text == f"word {i - 1}"
    vtt = to_vtt(_result())
    assert vtt.startswith("WEBVTT\n\n")
    assert re.findall(rf"^{VTT_TIME} --> {VTT_TIME}$", vtt, re.M) == [
        "00:00.000 --> 00:01.500", "00:01.500 --> 01:01:01.250"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "audiofast.cli", *args], capture_output=True,
                          text=True, timeout=600)


def test_cli_transcribes_every_format(tmp_path, clips):
    clip = clips["beckett"]
    run = _cli("transcribe", str(clip.audio), "--format", "all", "--output-dir",
               str(tmp_path), "--threads", "2")
    assert run.returncode == 0, run.stderr
    written = {p.suffix[1:] for p in tmp_path.iterdir()}
    assert written == set(FORMATS)
    assert wer(clip.reference, (tmp_path / "beckett.txt").read_text()) == 0.0
    data = json.loads((tmp_path / "beckett.json").read_text())
    assert normalize(data["text"]) == normalize(clip.reference)
    assert data["language"] == "en" and data["segments"][0]["start"] == 0.0
    srt = (tmp_path / "beckett.srt").read_text()
    stamps = re.findall(rf"^({SRT_TIME}) --> ({SRT_TIME})$", srt, re.M)
    assert stamps and all(_seconds(a) < _seconds(b) for a, b in stamps)
    ends = [_seconds(b) for _, b in stamps]
    assert ends == sorted(ends) and ends[-1] <= 10.0
    vtt = (tmp_path / "beckett.vtt").read_text()
    assert vtt.startswith("WEBVTT") and re.search(rf"^{VTT_TIME} --> {VTT_TIME}$", vtt, re.M)


def test_cli_bad_file_is_reported_and_the_rest_still_transcribed(tmp_path, clips):
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"RIFF....WAVEjunk")
    run = _cli("transcribe", str(bad), str(clips["clone-test"].audio), "--model",
               "whisper-tiny.en", "--threads", "2")
    assert run.returncode == 1
    [line] = run.stderr.strip().splitlines()
    assert line.startswith(f"audiofast: error: {bad}: cannot decode audio (")
    assert wer(clips["clone-test"].reference, run.stdout) == 0.0


def test_cli_unknown_model_and_format_guard(clips):
    run = _cli("transcribe", str(clips["beckett"].audio), "--model", "whisper-huge")
    assert run.returncode == 2
    assert "unknown model 'whisper-huge'" in run.stderr and "whisper-base" in run.stderr
    run = _cli("transcribe", str(clips["beckett"].audio), "--format", "all")
    assert run.returncode != 0 and "--format all needs --output-dir" in run.stderr
    for flag, bad in [("--window-pad", "-1"), ("--window-pad", "ten"), ("--batch-size", "-1"),
                      ("--chunk-length", "40"), ("--chunk-length", "0")]:
        run = _cli("transcribe", str(clips["beckett"].audio), flag, bad)
        assert run.returncode == 2 and flag in run.stderr, run.stderr


def test_cli_batched_chunks(tmp_path, clips):
    clip = clips["beckett"]  # 10 s in chunks of at most 8 s cut in the last 5 s: two
    run = _cli("transcribe", str(clip.audio), "--batch-size", "4", "--chunk-length", "8",
               "--window-pad", "10", "--language", "en", "--threads", "2", "--format", "json",
               "--output-dir", str(tmp_path))
    assert run.returncode == 0, run.stderr
    data = json.loads((tmp_path / "beckett.json").read_text())
    assert data["stats"]["chunks"] == 2 and data["stats"]["windows"] >= 2
    assert wer(clip.reference, data["text"]) <= 0.1, data["text"]
    assert all(s["start"] < s["end"] <= 10.0 for s in data["segments"])


def test_cli_samples_and_models():
    run = _cli("samples", "two_cities")
    assert run.returncode == 0 and run.stdout.strip().endswith("two_cities.wav")
    run = _cli("models")
    assert "whisper-base (default)" in run.stdout and "whisper-tiny.en" in run.stdout


def test_load_model_auto_picks_the_fused_decoder_where_it_may(clips):
    """``audiofast.load_model(engine="auto")`` (the CLI's default): the owned fused int8
    decoder for greedy, sequential decoding where the kernels are built, CTranslate2's decoder
    over the same loaded model for beams and batched chunks; another compute type means
    CTranslate2 alone, and the owned decoder's own options select it."""
    import audiofast
    from audiofast.asr import kernels
    from audiofast.asr.ct2_runtime import CT2Whisper
    from audiofast.asr.fast_runtime import FastWhisper
    from audiofast.asr.options import TranscribeOptions
    from audiofast.asr.runtime import AutoWhisper

    auto = audiofast.load_model("whisper-tiny.en", threads=1)
    assert isinstance(auto, AutoWhisper)
    greedy = auto.runtime_for(TranscribeOptions())
    assert isinstance(greedy, FastWhisper if kernels.is_built() else CT2Whisper)
    if kernels.is_built():
        assert greedy.ct2 is auto.ct2  # one CTranslate2 model encodes for both
    assert auto.runtime_for(TranscribeOptions(beam_size=5)) is auto.ct2
    batched = auto.runtime_for(TranscribeOptions(batch_size=4))  # greedy chunks side by side
    assert batched is (greedy if kernels.is_built() else auto.ct2)
    beckett = clips["beckett"].audio
    assert "Fail better" in auto.transcribe(beckett, TranscribeOptions(beam_size=2)).text
    assert "Fail better" in auto.transcribe(beckett).text
    assert isinstance(audiofast.load_model("whisper-tiny.en", compute_type="float32"),
                      CT2Whisper)
    assert isinstance(audiofast.load_model("whisper-tiny.en", precision="fp32"), FastWhisper)
    with pytest.raises(ValueError, match="engine must be one of auto, fast, ct2"):
        audiofast.load_model("whisper-tiny.en", engine="tpu")


@pytest.mark.parametrize("clip", ["clone-test", "two_cities"])  # 16 kHz WAV; 48 kHz via ffmpeg
def test_default_transcription_never_imports_torch(kernel, clips, tmp_path, clip):
    """The default path (CTranslate2 encoder, fused decoder from its memory-mapped cache,
    numpy features and decoding loop, PyAV for audio) runs without torch, whose import was
    most of a cold start. The first process may pack the weights (torch); the next must not."""
    code = ("import sys\nfrom audiofast.cli import main\n"
            "main(['transcribe', sys.argv[1], '--model', 'whisper-tiny.en', '--language', 'en',"
            " '--output-dir', sys.argv[2], '--format', 'txt'])\n"
            "print('torch' in sys.modules, 'torchcodec' in sys.modules)\n")
    runs = [subprocess.run([sys.executable, "-c", code, str(clips[clip].audio), str(tmp_path)],
                           capture_output=True, text=True, timeout=300) for _ in range(2)]
    assert runs[1].returncode == 0, runs[1].stderr[-2000:]
    assert runs[1].stdout.strip().splitlines()[-1] == "False False"
    assert wer(clips[clip].reference, next(tmp_path.glob("*.txt")).read_text()) < 0.1


def test_cli_internal_errors_exit_1_with_their_message(monkeypatch, capsys):
    """Only wrong input is a user error (exit 2, one line); a bug is reported as one, exit 1,
    with the traceback on request."""
    from audiofast import cli
    from audiofast.models import ModelNotFoundError

    def boom(args):
        raise ZeroDivisionError("a bug in a command")

    monkeypatch.setattr(cli.models, "_run_samples", boom)
    monkeypatch.delenv("AUDIOFAST_DEBUG", raising=False)
    assert cli.main(["samples"]) == 1
    assert capsys.readouterr().err.strip() == (
        "audiofast: internal error: ZeroDivisionError: a bug in a command "
        "(AUDIOFAST_DEBUG=1 or --debug shows the traceback)")
    assert cli.main(["--debug", "samples"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "in boom" in err
    monkeypatch.setenv("AUDIOFAST_DEBUG", "1")
    assert cli.main(["samples"]) == 1 and "Traceback" in capsys.readouterr().err

    def missing(args):
        raise ModelNotFoundError("unknown model 'x'\nsecond line")

    monkeypatch.setattr(cli.models, "_run_samples", missing)
    monkeypatch.delenv("AUDIOFAST_DEBUG")
    assert cli.main(["samples"]) == 2
    assert capsys.readouterr().err == "audiofast: error: unknown model 'x'\n"


def test_cli_command_errors_exit_2_in_one_line(tmp_path):
    run = _cli("generate", "a prompt", "--model", str(tmp_path / "nope"))
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"audiofast: error: SA3 checkpoint directory not found: {tmp_path / 'nope'}"]
