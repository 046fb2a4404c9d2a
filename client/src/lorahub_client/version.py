"""The client's version (its own module: every part may import it without the package)."""

__version__ = "0.1.0"
