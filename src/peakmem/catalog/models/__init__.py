"""Models as data: the architecture keys of each model's ``config.json`` on the Hugging Face Hub.

Each entry holds the keys :func:`peakmem.hf.spec_from_config` reads (and a few more that describe
the run: dropout, dtype), copied from the Hub file named in ``source``. Keys the Hub file omits are
left out, so transformers' defaults apply exactly as they do when it loads the file. Values were
checked against stored copies of the files (vendored configs and tests in public repositories,
model cards); where a value could not be confirmed that way the entry says so in ``note``.
``reported_params`` is the total parameter count the model card, paper or the Hub API states for
the transformers model (not the checkpoint size). It is an independent check of the shape keys:
tests require :func:`peakmem.hf.spec_from_config` to reproduce it exactly, and a torch-tier test
compares every entry with transformers' own model built on the meta device. Keys that do not
change shapes (dropout, dtype, token ids, rope details) were not all checked one by one; where a
shape-relevant value could not be confirmed, ``note`` says so.

The entries are kept by family in this package's modules (plain literals only: no I/O at import);
:data:`MODEL_ENTRIES` joins them in the order ``peakmem models`` lists them.
"""

from __future__ import annotations

from typing import Any

from peakmem.catalog.models import bert, deepseek, gemma, gpt, llama, phi_starcoder_olmo, qwen

MODEL_ENTRIES: tuple[dict[str, Any], ...] = (
    *gpt.ENTRIES,
    *llama.ENTRIES,
    *qwen.ENTRIES,
    *gemma.ENTRIES,
    *phi_starcoder_olmo.ENTRIES,
    *deepseek.ENTRIES,
    *bert.ENTRIES,
)
