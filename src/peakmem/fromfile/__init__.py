"""``--from FILE``: read a training framework's own configuration and map it onto peakmem's options.

One module per framework, each naming the keys it knows and the framework file that defines them:
:mod:`.axolotl`, :mod:`.llama_factory`, :mod:`.torchtune`, :mod:`.hf_trainer` (transformers
``TrainingArguments`` / TRL, and the TrainingArguments-level pieces axolotl and LLaMA-Factory share),
:mod:`.deepspeed` (DeepSpeed JSON), :mod:`.accelerate` (accelerate config YAML), :mod:`.torchtitan`
(torchtitan's TOML train configs). :mod:`.documents` reads and parses the files (the only I/O; YAML needs
PyYAML, the ``yaml`` extra; TOML is the standard library's ``tomllib``), :mod:`.mapper` holds the
result types and the shared conversions, :mod:`.merge` maps, merges and applies.

The mapping (:func:`map_documents`) is pure: dicts in, a :class:`FromFile` out, with every mapped field,
the key it came from, and the memory-relevant keys peakmem does not model.
"""

from peakmem.fromfile.documents import detect_format, find_referenced, load_document, parse_document
from peakmem.fromfile.mapper import FORMATS, Field, FromFile
from peakmem.fromfile.merge import (
    apply,
    load_and_apply,
    map_documents,
    map_training_arguments,
    read_from_files,
)

__all__ = [
    "FORMATS",
    "Field",
    "FromFile",
    "apply",
    "detect_format",
    "find_referenced",
    "load_and_apply",
    "load_document",
    "map_documents",
    "map_training_arguments",
    "parse_document",
    "read_from_files",
]
