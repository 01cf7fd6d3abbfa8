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


def test_gptq_rounds_onto_the_packers_grid_with_less_output_error():
    from audiofast.distill.gptq import gptq_round

    torch.manual_seed(0)
    weight = torch.randn(64, 256) * 0.05
    # Inputs that co-vary (as activations do): a few directions carry most of the energy.
    x = torch.randn(2000, 16) @ torch.randn(16, 256) + 0.3 * torch.randn(2000, 256)
    rounded = gptq_round(weight, x.T.double() @ x.double())
    nearest = dequantize_int4(*quantize_int4(weight))

    def output_error(w):
        return float(((x @ (w - weight).T) ** 2).mean())

    assert output_error(rounded) < 0.5 * output_error(nearest)
    assert not torch.equal(rounded, nearest)
    # On the packer's grid: packing it again (a fresh scale search) gives these values back.
    assert torch.equal(dequantize_int4(*quantize_int4(rounded)), rounded)
    _, scale = quantize_int4(weight)
    steps = rounded / scale.float().repeat_interleave(64, dim=1)
    assert torch.equal(steps, steps.round()) and steps.abs().max() <= 8


def test_gptq_export_reloads_on_its_grid(tmp_path, clips):
    out = tmp_path / "gptq"
    assert main(["distill", "--stage", "qad", "--lane", "asr", "--bits", "4", "--rounding",
                 "gptq", "--steps", "0", "--model", "whisper-tiny.en", "--sentences", "6",
                 "--workdir", str(tmp_path / "work"), "--out", str(out), "--threads", "2",
                 "--no-gate"]) == 0
    settings = json.loads((out / "audiofast.json").read_text())
    assert settings["recipe"]["rounding"] == "gptq" and settings["grid_reproduced"] == 1.0

    import audiofast

    model = audiofast.load_model(str(out), threads=2)
    text = model.transcribe(clips["beckett"].audio, audiofast.TranscribeOptions()).text
    assert "Fail again" in text, text
