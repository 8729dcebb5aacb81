"""The version of difffn (one place: the package, checkpoints and exported files read it)."""

__version__ = "0.1.0"
