"""Images as input of vision-language models (peakmem.formulas.images): the tokens the processors add."""

from __future__ import annotations

import contextlib
import io

import pytest

import peakmem
from peakmem.errors import InputError
from peakmem.formulas.images import Images, image_tokens, smart_resize
from peakmem.model import ModelSpec
from peakmem.resolve import resolve_config, spec_for_config


def _spec(name: str) -> ModelSpec:
    found, config = resolve_config(name)
    return spec_for_config(config, name=found)


def _tokens(model: str, w: int, h: int, count: int = 1, **kw: int) -> int:
    return image_tokens(_spec(model), Images(count=count, width=w, height=h, **kw)).per_image


def test_qwen25_vl_1024_square_rounds_up_to_the_factor() -> None:
    # factor 14 x 2 = 28: round(1024 / 28) = 37 -> 1036 px a side; 1036^2 = 1,073,296 <= 12,845,056 keeps it;
    # grid 1036 / 14 = 74 a side; 74 * 74 / 2^2 = 1,369 tokens
    assert _tokens("qwen2.5-vl-7b", 1024, 1024) == 1369


def test_qwen25_vl_beyond_max_pixels_is_resized_down() -> None:
    # 6000 x 4000 = 24e6 px > 12,845,056: beta = sqrt(24e6 / 12,845,056) = 1.36690;
    # h 4000 / beta = 2926.3 -> floor(104.5) * 28 = 2912; w 6000 / beta = 4389.5 -> floor(156.8) * 28 = 4368;
    # grid 208 x 312 = 64,896 patches / 4 = 16,224 tokens
    assert smart_resize(4000, 6000, 28, 3136, 12_845_056) == (2912, 4368)
    assert _tokens("qwen2.5-vl-7b", 6000, 4000) == 16224
    # the class default max_pixels 28 * 28 * 1280 = 1,003,520 given: 1036^2 is above it; beta =
    # sqrt(1024^2 / 1,003,520) = 1.02220, 1024 / beta = 1001.7 -> floor(35.8) * 28 = 980; 70^2 / 4 = 1,225
    assert _tokens("qwen2.5-vl-7b", 1024, 1024, max_pixels=1_003_520) == 1225


def test_qwen3_vl_patch_16_and_its_min_pixels() -> None:
    # factor 16 x 2 = 32: 1024 is a multiple; 1024^2 within 65,536..16,777,216; 64^2 / 4 = 1,024 tokens
    assert _tokens("qwen3-vl-8b", 1024, 1024) == 1024
    # 200 x 150: 192 x 160 = 30,720 < 65,536: beta = sqrt(65,536 / 30,000) = 1.47802; h 150 * beta = 221.7
    # -> ceil(6.93) * 32 = 224; w 200 * beta = 295.6 -> ceil(9.24) * 32 = 320; 14 x 20 / 4 = 70 tokens
    assert _tokens("qwen3-vl-8b", 200, 150) == 70


def test_gemma3n_is_fixed_per_image() -> None:
    spec = _spec("gemma-3n-e4b")
    got = image_tokens(spec, Images(count=3, width=4000, height=100))
    assert (got.per_image, got.total) == (256, 3 * 256)
    with pytest.raises(InputError, match=r"^min_pixels, max_pixels: "):
        image_tokens(spec, Images(count=1, width=64, height=64, max_pixels=10))


def test_train_with_images_equals_train_with_the_longer_seq() -> None:
    with_images = peakmem.train("qwen2.5-vl-7b", images=4, image_size="1024x1024").data
    text = peakmem.train("qwen2.5-vl-7b", seq=2048 + 4 * 1369).data
    assert with_images["breakdown"] == text["breakdown"]
    assert with_images["peak_allocated_bytes"] == text["peak_allocated_bytes"]
    line = next(a for a in with_images["assumptions"] if "image tokens" in a)
    assert line.startswith("seq 7,524 = 2,048 text + 5,476 image tokens: 4 images of 1024x1024 -> 4 x 1,369")
    assert "Qwen2.5-VL smart_resize" in line
    assert "vision tower activations not counted at its 21,904 patches" in line  # 4 x 74 x 74


@pytest.mark.parametrize(
    ("model", "kw", "match"),
    [("llama-3.2-1b", {"images": 1, "image_size": "64x64"}, r"^images: llama-3.2-1b has no vision tower"),
     ("qwen2.5-vl-7b", {"images": 2}, r"^image_size=None: "),
     ("qwen2.5-vl-7b", {"image_size": "64x64"}, r"^image_size, min_pixels, max_pixels: take them with"),
     ("qwen2.5-vl-7b", {"images": 1, "image_size": "1024"}, r"^image_size='1024': give WIDTHxHEIGHT"),
     ("qwen2.5-vl-7b", {"images": 1, "image_size": "20x20"}, r"^image_size=20x20: each side must be"),
     ("qwen2.5-vl-7b", {"images": 0, "image_size": "64x64"}, r"^images=0: must be at least 1"),
     ("qwen2.5-vl-7b", {"images": 1, "image_size": "64x64", "min_pixels": 9, "max_pixels": 8},
      r"^min_pixels=9: above max_pixels=8"),
     ("llama-4-scout", {"images": 1, "image_size": "336x336"}, r"^images: llama-4-scout's image processor")],
)  # fmt: skip
def test_bad_image_input_is_one_input_error(model: str, kw: dict[str, object], match: str) -> None:
    with pytest.raises(InputError, match=match):
        peakmem.train(model, **kw)


def test_serving_images_is_refused_not_ignored() -> None:
    with pytest.raises(InputError, match=r"^images: serving"):
        peakmem.fit("qwen2.5-vl-7b", gpu="80GB", infer=True, images=1, image_size="64x64")


def test_the_web_api_answers_images_as_the_cli() -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    import json

    from fastapi.testclient import TestClient

    from peakmem.cli import main
    from peakmem.web import app as web

    body = {"model": "qwen2.5-vl-7b", "images": 4, "image_size": "1024x1024", "seq": 1024}
    with TestClient(web.create_app()) as client:
        got = client.post("/api/train", json=body).json()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(
            [
                "train",
                "qwen2.5-vl-7b",
                "--images",
                "4",
                "--image-size",
                "1024x1024",
                "--seq",
                "1024",
                "--json",
            ]
        )
    cli = json.loads(buf.getvalue())
    assert got["peak_allocated_bytes"] == cli["peak_allocated_bytes"]
    assert got["setup"]["seq_len"] == cli["setup"]["seq_len"] == 1024 + 4 * 1369
