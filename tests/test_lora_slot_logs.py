"""benchmarks/lora_slot_logs.json (issue 31, multi-LoRA serving logs): the file's integrity, its recorded
split, and the comparison script's reading of each log line, checked by hand on one case."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from _bench import load_benchmark

ROOT = Path(__file__).parents[1] / "benchmarks"
FIELDS = {
    "id", "set", "what", "model", "engine", "version", "tp", "max_loras", "max_lora_rank", "max_cpu_loras",
    "gpu_memory_utilization", "max_model_len", "stated", "inferred", "source", "url", "quote",
}  # fmt: skip
KINDS = {"weights_v0", "weights_and_slots", "lora_delta", "kv_pool", "adapter_elements"}
QUOTE_MAX = 300  # characters: a quote, not a copy of the thread


def _data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "lora_slot_logs.json").read_text())
    return data


def _script() -> ModuleType:
    return load_benchmark("lora_slots")


def test_every_case_is_cited_complete_and_short() -> None:
    data = _data()
    cases = data["cases"]
    assert cases and len({c["id"] for c in cases}) == len(cases)
    for c in cases:
        assert set(c) >= FIELDS, (c["id"], FIELDS - set(c))
        assert c["what"] in KINDS and c["engine"] == ("tensorrt-llm" if "elements" in c else "vllm")
        assert c["url"].startswith("https://github.com/") and 0 < len(c["quote"]) <= QUOTE_MAX
        assert sum(key in c for key in ("gib", "gb", "mib", "elements")) == 1
    for n in data["not_compared"]:
        assert n["url"].startswith("https://github.com/") and n["why"] and 0 < len(n["quote"]) <= QUOTE_MAX


def test_the_split_follows_the_recorded_rule() -> None:
    """'split_decided' is dated and says odd-numbered cases fit, even ones are held out: each case obeys."""
    data = _data()
    assert re.match(r"\d{4}-\d{2}-\d{2}", data["split_decided"]) and "odd" in data["split_decided"]
    for c in data["cases"]:
        number = int(c["id"].removeprefix("L"))
        assert c["set"] == ("fit" if number % 2 else "held_out"), c["id"]


def test_the_kv_pool_case_loses_exactly_the_slots_by_hand() -> None:
    """L3 (Llama-3.3-70B, tp 4, 1 slot of rank 16): per layer and rank, rank x (input + output) of
    q 8192+2048, k 8192+256, v 8192+256, o 2048+8192, gate 8192+7168, up 8192+7168, down 7168+8192
    = 16 x 83,456; x 80 layers x 2 B = 213,647,360 B. Llama declares embedding_modules, so vLLM 0.8 also
    wraps embed_tokens and the logits processor, whole on each rank (formulas/serving/lora_slots.py; extra
    vocabulary E = 256, vocab 128,256, hidden 8,192): embedding (128,256 + 256) x 16 + 8,192 x 16 + 256 x
    8,192 = 4,284,416 values; logits 16 x 8,192 + 128,512 x 16 + 256 x 8,192 = 4,284,416; the base
    embedding's 256 extra rows and the LM head's 128,512 - 128,256 = 256, split over 4 ranks: 128 x 8,192;
    (2 x 4,284,416 + 1,048,576) x 2 B = 19,234,816 B, plus the int64 index of the LM head's 128,512 rows
    (1,028,096 B): 20,262,912 B. The pool peakmem compares is the sum smaller than without LoRA. The case
    is within the issue's 10 % (measured +0.6 %)."""
    script = _script()
    l3 = next(c for c in _data()["cases"] if c["id"] == "L3")
    with_lora, slots, _ = script.predicted(l3)
    without, _, _ = script.predicted({**l3, "max_loras": None, "max_lora_rank": None})
    wrappers = (2 * 4_284_416 + 128 * 8_192) * 2 + 128_512 * 8
    assert wrappers == 20_262_912
    assert slots == 16 * 83_456 * 80 * 2 + wrappers == 213_647_360 + 20_262_912
    assert without - with_lora == slots
    assert abs(with_lora / script.logged_bytes(l3) - 1) <= 0.10


def test_where_each_weight_line_puts_the_slots() -> None:
    """vLLM V0 up to 0.7 logs 'Loading model weights took' before building the LoRA manager: the script
    compares L1 with the weights alone, whatever the slots; vLLM 0.8's V0 (PR #14469) measures the weights
    and the LoRA stacks together: L2 is the weights plus the 213,647,360 + 20,262,912 B derived above."""
    script = _script()
    cases = {c["id"]: c for c in _data()["cases"]}
    got, slots, _ = script.predicted({**cases["L1"], "max_loras": 8, "max_lora_rank": 64})
    alone, _, _ = script.predicted(cases["L1"])
    assert slots == 0 and got == alone
    with_slots, slots, _ = script.predicted(cases["L2"])
    weights, _, _ = script.predicted({**cases["L2"], "what": "weights_v0"})
    assert slots == 213_647_360 + 20_262_912 and with_slots == weights + slots


def test_tensorrt_llm_adapter_size_by_hand() -> None:
    """L5 (Qwen1.5-7B, rank 8): TensorRT-LLM's "Max LoRA size" counts rank x (in + out) of q, k, v, o
    (4096 -> 4096 each) and gate, up, down (4096 <-> 11008) over 32 layers, the thread's own
    (4 x 4096 x 2 x 8 + 3 x (4096 + 11008) x 8) x 32 = 19,988,480; peakmem's count and the log agree."""
    case = next(c for c in _data()["cases"] if c["id"] == "L5")
    by_hand = (4 * 4096 * 2 * 8 + 3 * (4096 + 11008) * 8) * 32
    got, slots, _ = _script().predicted(case)
    assert by_hand == case["elements"] == got == slots == 19_988_480
