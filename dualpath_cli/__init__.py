"""dualpath: operations toolkit and embedded runtime for DualPath-style LLM inference."""

__version__ = "0.1.0"
__all__ = ["__version__"]
