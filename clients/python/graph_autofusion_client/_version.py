"""The package version; kept equal to pyproject.toml (checked by tests/test_install.py)."""

__version__ = "0.1.0"
