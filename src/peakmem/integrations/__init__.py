"""peakmem inside the frameworks people train with (optional: each module needs its framework).

* :mod:`peakmem.integrations.transformers`: ``PeakmemCallback``, a Hugging Face ``TrainerCallback`` that
  estimates the job at train begin, stops it before its first step when it will not fit, and logs
  measured against predicted peaks on CUDA. Needs the ``torch`` extra.

This package imports nothing itself: ``import peakmem`` and ``import peakmem.integrations`` stay light.
"""
