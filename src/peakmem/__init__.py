"""peakmem: how much GPU memory an LLM job takes, where every byte goes, and what makes it fit.

``import peakmem`` stays light: it imports only the standard library (no torch, no rich).
"""

__version__ = "0.1.0"
