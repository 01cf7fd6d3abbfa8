"""int4 quantization-aware distillation of the Whisper decoder: the grid it trains on is the
packer's, the export reloads on that grid at its own precision, and a killed run resumes."""

import json

import torch

from audiofast.asr.int4_pack import dequantize_int4, quantize_int4
from audiofast.cli import main
from audiofast.distill.asr_qad import Int4Grid


def test_grid_rounds_like_the_packer_and_passes_gradients():
    torch.manual_seed(0)
    weight = torch.randn(32, 128) * 0.03
    grid = Int4Grid(weight)
    assert torch.equal(grid(weight), dequantize_int4(*quantize_int4(weight)))
    trainable = weight.clone().requires_grad_()
    (grid(trainable) * 3).sum().backward()
    assert torch.equal(trainable.grad, torch.full_like(weight, 3.0))
    moved = weight + 0.004  # training moves weights; the grid (scales) stays PTQ's
    assert torch.equal(grid.scale, Int4Grid(weight).scale)
    assert not torch.equal(grid(moved), grid(weight))


def test_qad_command_trains_exports_resumes_and_reloads_at_int4(tmp_path, clips):
    args = ["distill", "--stage", "qad", "--lane", "asr", "--bits", "4", "--model",
            "whisper-tiny.en", "--steps", "2", "--sentences", "6", "--workdir",
            str(tmp_path / "work"), "--out", str(tmp_path / "qad"), "--threads", "2",
            "--no-gate"]
    assert main(args) == 0
    settings = json.loads((tmp_path / "qad" / "audiofast.json").read_text())
    assert settings["precision"] == "int4-head8"
    assert settings["grid_reproduced"] == 1.0  # packing again finds the trained grid
    (log,) = (tmp_path / "work").glob("whisper-tiny.en-qad-int4-head8-*.ckpt.log.jsonl")
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [0, 1]
    # More steps resume from the checkpoint instead of starting over.
    steps_at = args.index("--steps") + 1
    assert main([*args[:steps_at], "3", *args[steps_at + 1:]]) == 0
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [0, 1, 2]

    import audiofast

    model = audiofast.load_model(str(tmp_path / "qad"), threads=2)
    runtime = model.runtime_for(audiofast.TranscribeOptions())
    assert runtime.engine.precision == "int4-head8"  # the folder's own precision
    text = model.transcribe(clips["beckett"].audio, audiofast.TranscribeOptions()).text
    assert "Fail again" in text, text
