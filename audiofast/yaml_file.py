"""Reading a YAML config file with one-line errors (missing file, bad YAML, not a mapping)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def read_yaml_mapping(path: str | Path, what: str, error: type[Exception]) -> dict[str, Any]:
    """The mapping in ``path``; anything else raises ``error`` with one line naming the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{what} not found: {path}") from None
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected a mapping at the top level")
    return data
