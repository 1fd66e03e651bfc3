"""The package version, as PERSIA's ``persia.version.__version__``."""

__version__ = "0.1.0"
