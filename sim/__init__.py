"""npcsim's engine: state model, working memory, codecs, protocol, bus, store, inference, shard."""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    # One source of truth: the version in pyproject.toml, as the installed metadata has it.
    __version__ = version("npcsim")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
