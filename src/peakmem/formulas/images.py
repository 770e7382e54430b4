"""Images as input of a vision-language model: the tokens its processor puts in the sequence.

A VL model's processor replaces each image placeholder in the prompt with as many image tokens as the
vision tower hands to the language model, so the language model's sequence is the text plus
``images x tokens per image``. Per family (the processor's own arithmetic, with the defaults of the
checkpoint's ``preprocessor_config.json``, which override the processor class's):

* Qwen2-VL / Qwen2.5-VL: transformers ``models/qwen2_vl/image_processing_qwen2_vl.py`` (v4.50-v5)
  ``smart_resize(height, width, factor=patch_size * merge_size, min_pixels, max_pixels)``: each side
  rounded to a multiple of ``factor``; above ``max_pixels`` both sides scaled by
  ``sqrt(h * w / max_pixels)`` and floored to the factor, below ``min_pixels`` scaled up and ceiled.
  The grid is ``(h / patch_size, w / patch_size)`` patches (one frame repeated to the temporal patch:
  ``grid_t = 1``), and ``processing_qwen2_vl.py`` puts ``grid_t * grid_h * grid_w // merge_size**2``
  ``<|image_pad|>`` tokens per image. The class defaults are ``min_pixels = 56 * 56`` and
  ``max_pixels = 28 * 28 * 1280``; Qwen/Qwen2.5-VL-7B-Instruct's preprocessor_config.json sets
  ``min_pixels = 3136``, ``max_pixels = 12845056`` (16384 x 28 x 28), ``patch_size 14``,
  ``merge_size 2``, ``temporal_patch_size 2``: those are used.
* Qwen3-VL: ``Qwen3VLProcessor`` runs the same ``Qwen2VLImageProcessorFast`` ``smart_resize`` (not
  read in transformers' source here: taken as the Qwen2-VL arithmetic); Qwen/Qwen3-VL-8B-Instruct's
  preprocessor_config.json sets ``patch_size 16``, ``merge_size 2``,
  ``size = {"shortest_edge": 65536, "longest_edge": 16777216}`` (min and max pixels). The model repos'
  preprocessor files were not read here: these values are as public code quotes them (several
  projects' fixtures of the released Qwen3-VL processor), and the patch / merge sizes match the
  catalog config's vision_config.
* Gemma 3n: a fixed ``vision_soft_tokens_per_image = 256`` per image, whatever its size (the catalog's
  google/gemma-3n-E4B config.json sets 256; the processor's expansion is not re-read here:
  ``processing_gemma3n.py`` expands each image to ``boi + image_token * 256 + eoi``; the MobileNet
  tower sees the image resized to 768 x 768).

The patch size and the merge come from the spec's vision tower (:class:`peakmem.model.Tower`, read from
the config's vision_config); the pixel bounds are the checkpoint's preprocessor defaults above, overridden
by ``--min-pixels`` / ``--max-pixels``. The vision tower's own activations at its patch count are not
counted: the estimate prices a derived spec's tower blocks at the language model's (batch, seq), as
before (estimate.py ``_parts``), and the assumption line says so. Other VL families (Llama 4 tiles,
Gemma 4) are not modelled yet: asking is an InputError, never a guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from peakmem.errors import InputError
from peakmem.model import ModelSpec, Tower

# Qwen/Qwen2.5-VL-7B-Instruct preprocessor_config.json (and Qwen2-VL's): min_pixels, max_pixels
QWEN2_VL_MIN_PIXELS = 3136  # 56 * 56
QWEN2_VL_MAX_PIXELS = 12_845_056  # 16384 * 28 * 28
# Qwen/Qwen3-VL-8B-Instruct preprocessor_config.json: size.shortest_edge / size.longest_edge (pixels)
QWEN3_VL_MIN_PIXELS = 65_536  # 256 * 256
QWEN3_VL_MAX_PIXELS = 16_777_216  # 4096 * 4096
# smart_resize refuses images more elongated than this (image_processing_qwen2_vl.py)
QWEN_MAX_ASPECT_RATIO = 200
# Gemma3nConfig vision_soft_tokens_per_image (configuration_gemma3n.py default; the checkpoints' value)
GEMMA3N_TOKENS_PER_IMAGE = 256

_QWEN_PIXELS = {
    "qwen2_vl": (QWEN2_VL_MIN_PIXELS, QWEN2_VL_MAX_PIXELS, "Qwen2.5-VL"),
    "qwen2_5_vl": (QWEN2_VL_MIN_PIXELS, QWEN2_VL_MAX_PIXELS, "Qwen2.5-VL"),
    "qwen3_vl": (QWEN3_VL_MIN_PIXELS, QWEN3_VL_MAX_PIXELS, "Qwen3-VL"),
    "qwen3_vl_moe": (QWEN3_VL_MIN_PIXELS, QWEN3_VL_MAX_PIXELS, "Qwen3-VL"),
}
_FIXED = {"gemma3n": (GEMMA3N_TOKENS_PER_IMAGE, "Gemma 3n vision_soft_tokens_per_image")}
MAX_IMAGE_SIDE = 2**16  # pixels per side: 65,536 (real inputs stay under ~10k)


@dataclass(frozen=True, kw_only=True)
class Images:
    """Images in each sequence: how many, their size in pixels, and the Qwen processors' pixel bounds
    (None: the checkpoint's preprocessor defaults)."""

    count: int
    width: int
    height: int
    min_pixels: int | None = None
    max_pixels: int | None = None

    def __post_init__(self) -> None:
        if self.count < 1:
            raise InputError(f"images={self.count!r}: must be at least 1")
        for name, side in (("width", self.width), ("height", self.height)):
            if not 1 <= side <= MAX_IMAGE_SIDE:
                raise InputError(
                    f"image_size={self.width}x{self.height}: {name} must be 1..{MAX_IMAGE_SIDE:,}"
                )
        for name, px in (("min_pixels", self.min_pixels), ("max_pixels", self.max_pixels)):
            if px is not None and px < 1:
                raise InputError(f"{name}={px!r}: must be positive")


@dataclass(frozen=True, kw_only=True)
class ImageTokens:
    """The tokens the images add to the language model's sequence, and how they were counted."""

    per_image: int
    total: int
    assumption: str


def parse_image_size(text: str) -> tuple[int, int]:
    """``"WxH"`` -> (width, height); anything else an InputError naming image_size."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise InputError(f"image_size={text!r}: give WIDTHxHEIGHT in pixels, e.g. 1024x1024")
    return int(parts[0]), int(parts[1])


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The (height, width) the Qwen-VL processors resize an image to (image_processing_qwen2_vl.py
    ``smart_resize``): sides multiples of ``factor``, pixels within [min_pixels, max_pixels]."""
    if height < factor or width < factor:
        raise InputError(f"image_size={width}x{height}: each side must be at least {factor} pixels "
                         "(the processor's patch x merge)")  # fmt: skip
    if max(height, width) / min(height, width) > QWEN_MAX_ASPECT_RATIO:
        raise InputError(f"image_size={width}x{height}: aspect ratio above {QWEN_MAX_ASPECT_RATIO}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def vision_tower(spec: ModelSpec) -> Tower:
    """The spec's vision tower, or an InputError naming images for a model without one."""
    for tower in spec.towers:
        if tower.kind == "vision":
            return tower
    raise InputError(f"images: {spec.name} has no vision tower (a text-only model takes no images)")


def image_tokens(spec: ModelSpec, images: Images) -> ImageTokens:
    """The tokens ``images`` add to each sequence of ``spec``'s language model (module docstring)."""
    tower = vision_tower(spec)
    shown = f"{images.count} image{'s' if images.count > 1 else ''} of {images.width}x{images.height}"
    if spec.model_type in _FIXED:
        if images.min_pixels is not None or images.max_pixels is not None:
            raise InputError(f"min_pixels, max_pixels: {spec.name}'s processor takes no pixel bounds")
        per, why = _FIXED[spec.model_type]
        line = f"{shown} -> {images.count} x {per:,} tokens ({why}: fixed per image)"
        line += "; vision tower activations not counted"
        return ImageTokens(per_image=per, total=images.count * per, assumption=line)
    if spec.model_type not in _QWEN_PIXELS:
        raise InputError(f"images: {spec.name}'s image processor ({spec.model_type}) is not modelled yet "
                         "(Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Gemma 3n are)")  # fmt: skip
    if not tower.patch_size or not tower.spatial_merge_size:
        raise InputError(f"images: {spec.name}'s vision tower names no patch size or spatial merge")
    lo, hi, family = _QWEN_PIXELS[spec.model_type]
    lo = images.min_pixels if images.min_pixels is not None else lo
    hi = images.max_pixels if images.max_pixels is not None else hi
    if lo > hi:
        raise InputError(f"min_pixels={lo}: above max_pixels={hi}")
    patch, merge = tower.patch_size, tower.spatial_merge_size
    h, w = smart_resize(images.height, images.width, patch * merge, lo, hi)
    grid_h, grid_w = h // patch, w // patch
    per = grid_h * grid_w // (merge * merge)
    return ImageTokens(per_image=per, total=images.count * per, assumption=(
        f"{shown} -> {images.count} x {per:,} tokens ({family} smart_resize to {w}x{h} within "
        f"{lo:,}..{hi:,} pixels, {grid_w}x{grid_h} patches of {patch} px, {merge}x{merge} merged); "
        f"vision tower activations not counted at its {images.count * grid_h * grid_w:,} patches (its "
        "blocks are priced at the language model's sequence)"))  # fmt: skip
