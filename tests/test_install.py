"""The package works installed from its wheel, not only from a checkout: the data it reads
(gate thresholds, eval sentences, references, stage configs) travel inside the wheel and are
found through importlib.resources."""

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv's python with the built wheel installed (not editable). The heavy
    dependencies come from this test's environment by path only: its .pth files, among them
    the editable install's finder, are not read, so ``audiofast`` can only come from the
    wheel."""
    tmp = tmp_path_factory.mktemp("install")
    # Built from a copy of the sources: setuptools leaves build/ in the tree it builds, and a
    # stale build/lib (a module since removed) would slip into the wheel.
    source = tmp / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "runs", "build", "results", "*.egg-info", "__pycache__", "teacher",
        "benchmarks", ".pytest_cache", ".ruff_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", str(source), "-w", str(tmp / "wheel")], check=True)
    (wheel,) = (tmp / "wheel").glob("audiofast-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(tmp / "site"), str(wheel)], check=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")],
                   check=True)
    python = tmp / "venv" / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    (site / "a_wheel.pth").write_text(str(tmp / "site") + "\n")  # first on the path
    (site / "b_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _audiofast(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "audiofast.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600)


def test_installed_wheel_runs_outside_the_checkout(installed, tmp_path):
    where = subprocess.run([str(installed), "-c", "import audiofast, audiofast.resources as r;"
                            "print(audiofast.__file__); print(r.in_checkout())"],
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    module, checkout = where.split()
    assert str(ROOT) not in module and checkout == "False"
    run = _audiofast(installed, "samples", "beckett", cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip().endswith("beckett.wav"), run.stderr
    run = _audiofast(installed, "gate", "--help", cwd=tmp_path)
    assert run.returncode == 0 and "--baseline" in run.stdout
    texts = tmp_path / "two.txt"
    texts.write_text("The birch canoe slid on the smooth planks.\n"
                     "Glue the sheet to the dark blue background.\n")
    run = _audiofast(installed, "eval", "roundtrip", "--model", "whisper-tiny.en", "--texts",
                     str(texts), "--voices", "flite:slt", "--threads", "2", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "tts" in run.stdout.lower() and "wer" in run.stdout.lower()
    # the shipped gate config and its sentences, read from the wheel's copy
    code = ("from audiofast.eval.gate import load_config, gate_texts, DEFAULT_CONFIG\n"
            "print(DEFAULT_CONFIG); print(len(gate_texts(load_config())))")
    out = subprocess.run([str(installed), "-c", code], capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout.split()
    assert str(ROOT) not in out[0] and int(out[1]) == 53
