"""npcsim's engine: state model, working memory, codecs, bus, store, inference, runner."""

__version__ = "0.1.0"
