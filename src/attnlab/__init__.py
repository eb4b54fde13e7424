"""attnlab: reproduce and ablate what attention buys (Synthesizer, Universal Transformer, BigBird, QKNorm)."""

__version__ = "0.1.0"
