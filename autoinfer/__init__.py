"""autoinfer: find the fastest way to run a big Mixture-of-Experts model on a GPU too small to hold it."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("autoinfer")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+source"
