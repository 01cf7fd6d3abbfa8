"""``python -m audiofast.cli``."""

from audiofast.cli import entry

entry()
