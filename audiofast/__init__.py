"""audiofast: make audio models fast without making them worse."""

__version__ = "0.1.0"
