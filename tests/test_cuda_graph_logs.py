"""benchmarks/cuda_graph_logs.json (issue 31, CUDA graph capture logs): the file's integrity, its recorded
splits, and the comparison script's reading of the speculative-decoding cases, checked against the capture
sizes the logs themselves print."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from _bench import load_benchmark
from peakmem.units import MiB

LOGS = Path(__file__).parents[1] / "benchmarks" / "cuda_graph_logs.json"
# the cases split by hand ('split_decided'); every later one by 'split_rule_3'
FIRST_CASES = {"F1", "F2", "F2-pool", "H1", "H2", "H3", "H4"}
KINDS = {"took", "estimated", "per_graph", "nvidia_smi_delta", "kv_pool", "sglang_mem_usage"}
QUOTE_MAX = 400  # characters: a quote, not a copy of the thread
SPLIT_RULES = (3, 4, 5, 6)  # the rules that split the cases added after the first seven


def _data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(LOGS.read_text())
    return data


def test_cases_are_cited_and_split_by_their_rule() -> None:
    """Every case and every log not compared has a GitHub URL and a short quote; ids are unique; the cases
    added after the first seven sit where their split rule puts them: each rule's cases (``split_rule``: 4;
    none: split_rule_3) ordered by SHA-256 of the id, the 1st, 3rd, ... held out."""
    data = _data()
    cases = data["cases"]
    assert len({c["id"] for c in cases}) == len(cases)
    for entry in [*cases, *data["not_compared"]]:
        assert entry["url"].startswith("https://github.com/"), entry["url"]
        assert 0 < len(entry["quote"]) <= QUOTE_MAX, entry["url"]
    assert all(n["why"] for n in data["not_compared"])
    assert {c["what"] for c in cases} <= KINDS and {c["set"] for c in cases} == {"fit", "held_out"}
    for rule in SPLIT_RULES:
        assert f"split_rule_{rule}" in data and f"searched_{rule}" in data, rule
        later = sorted((c for c in cases if c["id"] not in FIRST_CASES and c.get("split_rule", 3) == rule),
                       key=lambda c: hashlib.sha256(c["id"].encode()).hexdigest())  # fmt: skip
        assert later, f"split_rule_{rule} names cases"
        for i, case in enumerate(later):
            assert case["set"] == ("held_out" if i % 2 == 0 else "fit"), case["id"]
            assert case["setup_source"] and case["inferred"], case["id"]
    assert {c.get("split_rule", 3) for c in cases if c["id"] not in FIRST_CASES} == set(SPLIT_RULES)


def test_speculative_cases_capture_the_logged_sizes() -> None:
    """The club-3090 cases (vLLM, MTP with 3 speculative tokens, cudagraph_mode PIECEWISE): vLLM 0.12+
    captures sizes [1, 2, 4] + multiples of 8 up to min(2 x max_num_seqs x (1 + 3), 512): max_num_seqs 2
    gives [1, 2, 4, 8, 16] (the log's 'PIECEWISE ... 5/5'), 4 gives [1, 2, 4, 8, 16, 24, 32] (the log's
    'PIECEWISE=7 (largest=32)'); each graph costs at least PER_GRAPH_BYTES (6 MiB)."""
    module = load_benchmark("cuda_graphs")
    graphs = {2: 5, 4: 7}
    spec_cases = [c for c in _data()["cases"] if "draft" in c]
    assert spec_cases
    for case in spec_cases:
        got, how = module.predicted(case)
        n = graphs[case["max_num_seqs"]]
        assert how.startswith(f"{n} graphs (piecewise, K=3)"), (case["id"], how)
        assert got >= n * 6 * MiB, case["id"]


def test_a_log_with_both_figures_prints_its_ratio() -> None:
    """A log holding vLLM's estimate and its "took" (one url) gets one line with estimated / took; a log
    with only one of them, or another engine's figure, gets none. Made-up cases: 0.13 / 0.10 GiB = 1.30."""
    module = load_benchmark("cuda_graphs")
    base = {"engine": "vllm", "set": "fit"}
    cases = [
        {**base, "url": "u1", "what": "estimated", "gib": 0.13},
        {**base, "url": "u1", "what": "took", "gib": 0.10},
        {**base, "url": "u2", "what": "estimated", "gib": 0.5},
        {**base, "engine": "sglang", "url": "u3", "what": "took", "gib": 0.2},
    ]
    line = "u1 (fit): vLLM estimated / took = 1.30 (logged figures), peakmem 1.00"
    assert module.pair_lines(cases) == [line]


def test_capture_replay_frees_every_request_and_reuses_the_pool() -> None:
    """``--pool``'s replay (brief h-graphscale) on a tiny gated spec (2 layers, hidden 64, q 4 x 16, kv 2 x
    16, intermediate 128): 4 requests before the layers (residual, hidden, qkv, attention output), 4 a layer
    (o_proj, gate_up, activation, down) and 2 more (qkv, attention output) for every layer but the last:
    4 + 8 + 2 = 14, each freed once (nothing kept). At 16 tokens gate_up is 16 x 2 x 128 x 2 B = 8 KiB. Every
    request is <= 1 MiB: one 2 MiB small segment (kSmallBuffer) for the first size, none for the next one,
    which finds its blocks free in the pool, whichever order the sizes come in."""
    from _infer_specs import tiny

    module = load_benchmark("cuda_graphs")
    spec = tiny()
    assert spec.groups[0].layer.mlp.gated
    requests = module.capture_requests(spec, 16)
    mallocs = [(k, n) for k, n in requests if n]
    assert len(mallocs) == 14 and sorted(k for k, n in requests if not n) == sorted(k for k, _ in mallocs)
    assert max(n for _, n in mallocs) == 16 * 2 * 128 * 2
    assert module.pool_growth(spec, [16, 8]) == [2 * MiB, 0]
    assert module.pool_growth(spec, [8, 16]) == [2 * MiB, 0]
