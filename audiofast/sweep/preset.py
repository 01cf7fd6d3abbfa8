"""Presets: a sweep's chosen configuration as a small YAML in ``configs/presets/`` that
``audiofast transcribe --preset NAME`` (ASR lane) and ``generate --preset NAME`` (audio lane)
read. A preset sets the options left at their defaults; options given on the command line
with another value win. ``$AUDIOFAST_PRESETS`` moves the folder (tests)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from audiofast.sweep.params import SweepConfigError


def presets_dir() -> Path:
    from audiofast.resources import writable_presets_dir

    return writable_presets_dir()


# preset key -> transcribe's argparse dest (None: applied after the model is built)
TRANSCRIBE_KEYS = {"model": "model", "engine": "engine", "window_pad": "window_pad",
                   "precision": "precision", "compute_type": "compute_type",
                   "drafter": "drafter", "draft_model": "draft_model", "encoder": "encoder",
                   "beam_size": "beam_size", "threads": "threads", "draft_len": None,
                   "ngram_order": None, "vocab_keep": None}
GENERATE_KEYS = {"model": "model", "steps": "steps", "cfg_scale": "cfg", "sampler": "sampler",
                 "quantization": None, "student": None}


def preset_path(name: str | Path) -> Path:
    """A name (``whisper-base-fast``) is looked up in configs/presets; a path is a path."""
    text = str(name)
    if text.endswith((".yaml", ".yml")) or os.sep in text:
        return Path(text)
    return presets_dir() / f"{text}.yaml"


def write_preset(name: str, lane: str, config: dict[str, Any], source: dict[str, Any],
                 directory: Path | None = None) -> Path:
    """``configs/presets/NAME.yaml`` (or ``directory``), written whole or not at all."""
    keys = TRANSCRIBE_KEYS if lane == "asr" else GENERATE_KEYS
    body = {"lane": lane} | {k: config[k] for k in keys if k in config}
    path = (directory / f"{name}.yaml") if directory else preset_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# Written by audiofast sweep (study {source.get('study')}, trial "
              f"{source.get('trial')}); held-back verdict: {source.get('confirmed')}.\n"
              f"# Use: audiofast "
              f"{'transcribe' if lane == 'asr' else 'generate'} --preset {name} ...\n")
    text = header + yaml.safe_dump(body | {"source": source}, sort_keys=False)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def load_preset(name: str | Path, lane: str) -> dict[str, Any]:
    path = preset_path(name)
    if not path.is_file():
        folder = presets_dir()
        have = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
        raise SweepConfigError(f"no preset {str(name)!r} ({path}); have: "
                               f"{', '.join(have) or 'none (run audiofast sweep)'}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SweepConfigError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or data.get("lane") != lane:
        raise SweepConfigError(f"{path}: not a preset of the {lane} lane")
    keys = TRANSCRIBE_KEYS if lane == "asr" else GENERATE_KEYS
    unknown = sorted(set(data) - set(keys) - {"lane", "source"})
    if unknown:
        raise SweepConfigError(f"{path}: {unknown[0]}: unknown preset key (known: "
                               f"{sorted(keys)})")
    return data


def apply_preset(args, parser_defaults: dict[str, Any], name: str | Path, lane: str
                 ) -> dict[str, Any]:
    """Set ``args``' options that are still at their parser defaults from the preset; returns
    the preset's keys with no command-line option (drafter tuning, quantization)."""
    data = load_preset(name, lane)
    keys = TRANSCRIBE_KEYS if lane == "asr" else GENERATE_KEYS
    extra = {}
    for key, dest in keys.items():
        if key not in data:
            continue
        if dest is None:
            extra[key] = data[key]
        elif getattr(args, dest) == parser_defaults.get(dest):
            value = data[key]
            if dest in ("draft_model",) and value is not None:
                value = Path(value)
            setattr(args, dest, value)
    return extra


def apply_cli_preset(args, lane: str) -> dict[str, Any]:
    """:func:`apply_preset` for a command's ``--preset`` (``args.preset_defaults`` set by its
    parser); a bad preset is the command's one-line error."""
    if not args.preset:
        return {}
    try:
        return apply_preset(args, args.preset_defaults, args.preset, lane)
    except SweepConfigError as e:
        raise SystemExit(f"audiofast: error: {e}") from None
