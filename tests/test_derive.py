"""Derived specs and measured block costs (peakmem.block_costs: no torch; peakmem.simulate.derive: torch).

Hand-derived: the fit through three measurements; the JSON round trip of a spec. Torch tier: a
derived spec's parameter count equals the meta-built model's, and its measured costs give the same
peak as the formulas (the formulas' own tiny families) and as ``simulate`` (an exact-step oracle).
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peakmem import block_costs
from peakmem.errors import ConfigError
from peakmem.hf import spec_from_config
from peakmem.training import family_key
from tiny_models import GPT2, LLAMA, needs_timm


def test_fit_recovers_hand_coefficients() -> None:
    # bytes = 10 per token + 3 per (batch x seq^2) + 8 per seq^2 (a mask the batch shares) + 100
    def f(b: int, s: int) -> int:
        return 10 * b * s + 3 * b * s * s + 8 * s * s + 100

    fitted = block_costs.fit([(b, s, f(b, s)) for b, s in ((1, 32), (1, 64), (2, 64), (1, 128), (2, 32))])
    assert fitted.coefficients == (Fraction(10), Fraction(3), Fraction(8), Fraction(0), Fraction(100))
    assert fitted.at(4, 1000) == 10 * 4000 + 3 * 4 * 10**6 + 8 * 10**6 + 100


_FRACTIONS = st.fractions(min_value=-(10**9), max_value=10**9, max_denominator=10**6)


@given(coefficients=st.tuples(*[_FRACTIONS] * 5), batch=st.integers(1, 512), seq=st.integers(1, 10**6))
@settings(max_examples=300, deadline=None)
def test_fit_in_integers_is_the_fractions_value(coefficients, batch: int, seq: int) -> None:  # type: ignore[no-untyped-def]
    """A fit's value computed over the coefficients' common denominator is round() of the exact
    fraction, half to even as Fraction rounds it."""
    a, b, c, d, e = coefficients
    fit = block_costs.Fit(per_token=a, per_seq2=b, seq2=c, seq=d, const=e)
    exact = a * batch * seq + b * batch * seq * seq + c * seq * seq + d * seq + e
    assert fit.at_signed(batch, seq) == round(exact)


def test_fit_in_integers_rounds_half_to_even() -> None:
    assert [block_costs.Fit(const=Fraction(k, 2)).at_signed(1, 1) for k in (1, 3, 5, -1, -3)] == [
        0,
        2,
        2,
        0,
        -2,
    ]


def test_fit_refuses_shapes_that_do_not_separate() -> None:
    with pytest.raises(ValueError, match="do not separate"):
        block_costs.fit([(1, 32, 1), (1, 32, 2), (1, 64, 3), (2, 64, 4), (1, 128, 5)])  # a shape twice


def _series(values: dict[tuple[int, int], tuple[tuple[int, ...], tuple[tuple[int, int, int], ...]]],
            grads: int = 0) -> list[tuple[int, int, block_costs.Measured]]:  # fmt: skip
    return [(b, s, block_costs.Measured(saved=4 * b * s, forward=f, backward=bw, grads=grads))
            for (b, s), (f, bw) in values.items()]  # fmt: skip


SHAPES5 = ((2, 32), (2, 64), (4, 64), (2, 128), (4, 32))


def test_each_peak_instant_is_fitted_on_its_own() -> None:
    """Two forward instants: 100 bytes a token (larger at short sequences) and 2 x B x s^2 (scores,
    larger from s = 50): their maximum is no polynomial, so a fit through the five peaks misses both
    ways; each instant fitted on its own and the larger taken is exact at any shape."""

    def fwd(b: int, s: int) -> tuple[int, ...]:
        return (100 * b * s, 0, 2 * b * s * s, 0)  # each a peak: the next event frees

    cost = block_costs.block_cost(_series({(b, s): (fwd(b, s), ()) for b, s in SHAPES5}))
    assert len(cost.forward) == 2  # the trailing 0 is never the largest: pruned
    for b, s in ((1, 16), (2, 32), (8, 1024), (64, 8192)):
        assert cost.at(b, s).forward_transient == max(100 * b * s, 2 * b * s * s)
        assert cost.at(b, s).saved == 4 * b * s
    peaks = block_costs.fit([(b, s, max(100 * b * s, 2 * b * s * s)) for b, s in SHAPES5])
    assert peaks.at(8, 1024) != 2 * 8 * 1024 * 1024  # what one fit through the peaks said


def test_backward_peak_counts_the_weight_gradients_written_by_then() -> None:
    """An MoE-like backward: 60 bytes a token at its experts' output gradients, before any weight
    gradient; then 20 a token while all 1000 bytes of weight gradients are written. With 1000 gradient
    bytes the first instant is the peak from 25 tokens up (no gradients in flight), the second below."""

    def bwd(b: int, s: int) -> tuple[tuple[int, int, int], ...]:
        t = b * s
        return ((60 * t, 0, 0), (20 * t, 40 * t, 0), (20 * t, 40 * t, 1000), (10 * t, 50 * t, 1000))

    cost = block_costs.block_cost(_series({(b, s): ((0,), bwd(b, s)) for b, s in SHAPES5}, grads=1000))
    at = cost.at(2, 64, 1000)
    assert (at.backward_transient, at.grads_in_flight, at.freed) == (60 * 128, 0, 0)
    at = cost.at(1, 16, 1000)
    assert (at.backward_transient, at.grads_in_flight, at.freed) == (20 * 16 + 1000, 1000, 40 * 16)
    # a method that trains half of them (the share measured written, of what the setup writes)
    assert cost.at(1, 16, 500).backward_transient == max(60 * 16, 20 * 16 + 500)


def test_micro_batch_one_fitted_on_its_own() -> None:
    """Three micro-batch-1 lengths give s^2, s and a constant: 3 s^2 + 5 s + 7."""
    one = block_costs.fit_single([(1, s, 3 * s * s + 5 * s + 7) for s in (32, 64, 128)])
    assert (one.seq2, one.seq, one.const) == (3, 5, 7)
    cost = block_costs.BlockCost(
        saved=block_costs.Fit(per_token=Fraction(10)), batch1=block_costs.BlockCost(saved=one)
    )
    assert cost.at(1, 1000).saved == 3 * 10**6 + 5 * 1000 + 7
    assert cost.at(2, 1000).saved == 10 * 2000


def test_batch_linear_check_compares_every_candidate_instant() -> None:
    """Micro-batch 1 agrees with the batch-2/4 fit only if every instant that can peak does: a copy at
    batch >= 2 that is a view at batch 1 (here 8 bytes a token fewer at the second, smaller instant)
    changes no peak at (1, 64) and is still caught."""

    def fwd(b: int, s: int, view: bool = False) -> tuple[int, ...]:
        return (100 * b * s, 0, (2 - (1 if view else 0)) * b * s * s // 64, 0)

    pts = _series({(b, s): (fwd(b, s), ()) for b, s in SHAPES5})
    same = block_costs.Measured(saved=4 * 64, forward=fwd(1, 64), backward=())
    view = block_costs.Measured(saved=4 * 64, forward=fwd(1, 64, view=True), backward=())
    assert block_costs.batch_linear_at(pts, 1, 64, same)
    assert not block_costs.batch_linear_at(pts, 1, 64, view)
    assert not block_costs.batch_linear_at(
        pts, 1, 64, block_costs.Measured(saved=4 * 64, forward=(0,), backward=())
    )


def test_shipped_costs_of_another_layout_are_not_read(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A shipped file measured at another COSTS_VERSION is stale: its costs are not used (with torch
    they are measured again; without, the error says torch is needed)."""
    import json

    cost = block_costs.BlockCost(saved=block_costs.Fit())
    doc = {"config_hash": "h" * 16, "costs": {"fam": {"block": cost.to_json()}}}
    monkeypatch.setattr(block_costs, "SHIPPED", tmp_path)
    monkeypatch.setattr(block_costs, "_SHIPPED_INDEX", None)
    (tmp_path / "m.json").write_text(json.dumps({**doc, "costs_version": block_costs.COSTS_VERSION - 1}))
    assert block_costs._shipped_costs("h" * 16, "fam") is None
    (tmp_path / "m.json").write_text(json.dumps({**doc, "costs_version": block_costs.COSTS_VERSION}))
    monkeypatch.setattr(block_costs, "_SHIPPED_INDEX", None)  # the files are parsed once per process
    assert block_costs._shipped_costs("h" * 16, "fam") == {"block": cost}


def test_output_kept_is_fitted_and_read_back() -> None:
    """The block's output kept into its backward (under checkpointing not rebuilt): 2 bytes a token."""
    pts = [
        (b, s, block_costs.Measured(saved=6 * b * s, forward=(0,), backward=(), output=2 * b * s))
        for b, s in SHAPES5
    ]
    cost = block_costs.block_cost(pts)
    assert cost.at(8, 512).output_kept == 2 * 8 * 512
    assert block_costs.BlockCost.from_json(cost.to_json()) == cost
    assert (
        block_costs.BlockCost(saved=block_costs.Fit()).at(2, 8).output_kept is None
    )  # not measured (costs v2)


def test_edge_blocks_fall_back_to_their_kind() -> None:
    """The last block in a group of its own keyed ``:last``; its costs, where not measured apart, the
    kind's; a LoRA first block of a one-layer model is ``:last:first`` and falls back twice."""
    from dataclasses import replace

    from peakmem.model import DerivedBlock, split_last_block

    spec = spec_from_config(LLAMA)
    assert split_last_block(spec) is spec  # not a derived spec
    layer = replace(spec.groups[0].layer, derived=DerivedBlock(key="h:k", mixer="attention", ffn="dense"))
    spec = replace(spec, groups=(replace(spec.groups[0], layer=layer),), derived_from="h")
    split = split_last_block(spec)
    assert [(g.count, g.layer.derived.key) for g in split.groups] == [(1, "h:k"), (1, "h:k:last")]
    assert split.params == spec.params
    kind, last = (
        block_costs.BlockCost(saved=block_costs.Fit(const=Fraction(1))),
        block_costs.BlockCost(saved=block_costs.Fit()),
    )
    assert block_costs.block_key_costs({"h:k": kind}, "h:k:last") is kind
    assert block_costs.block_key_costs({"h:k": kind}, "h:k:last:first") is kind
    assert block_costs.block_key_costs({"h:k": kind, "h:k:last": last}, "h:k:last") is last
    assert block_costs.block_key_costs({}, "h:k:last") is None


def test_spec_json_round_trip_is_exact() -> None:
    spec = spec_from_config(LLAMA)
    assert block_costs.spec_from_json(block_costs.spec_to_json(spec)) == spec


def test_info_says_which_path_answered() -> None:
    from peakmem.answers import spec_json

    out = spec_json(spec_from_config(LLAMA))
    assert out["answered_by"]["path"] == "formulas"
    assert out["blocks"] is None


def test_costs_without_provider_name_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from dataclasses import replace

    monkeypatch.setenv(block_costs.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(block_costs, "_PROVIDER", [])  # as without torch
    with pytest.raises(ConfigError, match=r"pip install 'peakmem\[torch\]'"):
        block_costs.costs_for("0" * 16, "fp32|sdpa|cpu|full")
    spec = replace(spec_from_config(LLAMA), derived_from="0" * 16)
    with pytest.raises(ConfigError, match=r"pip install 'peakmem\[torch\]'"):
        block_costs.stored_lookup(spec, "fp32|sdpa|cpu|full", "k")  # what an estimator reads by default


def test_cache_round_trip(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv(block_costs.CACHE_ENV, str(tmp_path))
    b1 = block_costs.BlockCost(saved=block_costs.Fit(seq=Fraction(3)))
    bc = block_costs
    cost = bc.BlockCost(saved=bc.Fit(per_token=Fraction(7, 2)), forward=(bc.Fit(),),
                        backward=(bc.Instant(transient=bc.Fit(const=Fraction(5)), grads=Fraction(1, 3)),),
                        batch1=b1, long=bc.BlockCost(saved=bc.Fit(per_token=Fraction(9, 2))))  # fmt: skip
    assert cost.at(2, block_costs.SHORT_MAX_SEQ + 1).saved == 9 * (
        block_costs.SHORT_MAX_SEQ + 1
    )  # 2 x 129 x 9/2
    assert cost.at(2, block_costs.SHORT_MAX_SEQ).saved == 7 * block_costs.SHORT_MAX_SEQ
    block_costs._write_cache("abc", "fp32|sdpa|cpu|full", {"k": cost})
    assert block_costs._read_cache("abc", "fp32|sdpa|cpu|full") == {"k": cost}


# --- torch tier ----------------------------------------------------------------------------------
torch_only = pytest.mark.torch


@pytest.fixture
def derive(monkeypatch: pytest.MonkeyPatch, tmp_path):  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.setenv(block_costs.CACHE_ENV, str(tmp_path))
    from peakmem.simulate import derive as mod

    return mod


@torch_only
@pytest.mark.parametrize("config", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_derived_count_is_the_models(derive, config) -> None:  # type: ignore[no-untyped-def]
    spec = derive.derive_spec(config)
    model = derive.build_meta(config)
    assert spec.params == derive.model_params(model) == spec_from_config(config).params
    assert spec.params_by_component() == spec_from_config(config).params_by_component()
    assert spec.tie_word_embeddings == spec_from_config(config).tie_word_embeddings
    assert [g.count for g in spec.groups] == [2]
    assert spec.groups[0].layer.derived is not None
    assert spec.groups[0].layer.derived.mixer == "attention"


@torch_only
@pytest.mark.slow
@pytest.mark.parametrize(
    ("precision", "method"),
    [("mixed-bf16", "full"), ("amp-bf16", "full"), ("mixed-bf16", "lora"), ("mixed-bf16", "qlora")],
)
@pytest.mark.parametrize("config", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_derived_peak_agrees_with_formulas(derive, config, precision, method) -> None:  # type: ignore[no-untyped-def]
    """Issue 14 item 5: within 2% of the formulas (tolerance from the issue)."""
    from peakmem.estimate import estimate_training
    from peakmem.training import TrainingSetup

    setup = TrainingSetup(precision=precision, method=method, seq_len=128, micro_batch=2, kernel_policy="cpu")
    d = estimate_training(
        derive.derive_spec(config), setup, costs=block_costs.provided_lookup
    ).peak_allocated_bytes
    f = estimate_training(spec_from_config(config), setup).peak_allocated_bytes
    assert abs(d - f) <= 0.02 * f


@torch_only
def test_resolve_falls_back_to_derived(derive) -> None:  # type: ignore[no-untyped-def]
    from peakmem.resolve import spec_for_config

    config = derive.tiny_config("smollm3")
    spec = spec_for_config(config, name="tiny-smollm3", derive=derive.derive_spec)
    assert spec.derived_from
    assert spec.params == derive.model_params(derive.build_meta(config))
    assert any("derived from transformers" in n for n in spec.notes)


@torch_only
@pytest.mark.slow
def test_shipped_data_answers_without_the_oracle(derive, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 14 item 4: a shipped file (spec + costs) answers with no provider, and regenerating it
    gives the same document."""
    import json

    from peakmem.estimate import estimate_training
    from peakmem.resolve import spec_for_config
    from peakmem.training import TrainingSetup

    config = derive.tiny_config("smollm3")
    family = "fp32|sdpa|cpu|full"
    doc = derive.shipped_document(config, "tiny-smollm3", (family,))
    (tmp_path / "tiny-smollm3.json").write_text(json.dumps(doc))
    monkeypatch.setattr(block_costs, "SHIPPED", tmp_path)
    monkeypatch.setattr(block_costs, "_SHIPPED_INDEX", None)
    monkeypatch.setattr(block_costs, "_MEMORY", {})
    monkeypatch.setattr(block_costs, "_PROVIDER", [])
    monkeypatch.setenv(block_costs.CACHE_ENV, str(tmp_path / "empty-cache"))
    spec = spec_for_config(config, name="tiny-smollm3")
    assert spec.params == derive.model_params(derive.build_meta(config))
    setup = TrainingSetup(precision="fp32", seq_len=64, micro_batch=2, kernel_policy="cpu")
    assert estimate_training(spec, setup).peak_allocated_bytes > 0
    again = derive.shipped_document(config, "tiny-smollm3", (family,))
    assert json.loads(json.dumps(again)) == json.loads((tmp_path / "tiny-smollm3.json").read_text())


SHIPPED_FILES = sorted(block_costs.SHIPPED.glob("*.json"), key=lambda p: p.name)


@torch_only
@pytest.mark.parametrize("path", SHIPPED_FILES, ids=lambda p: p.stem)
def test_shipped_files_regenerate(derive, path) -> None:  # type: ignore[no-untyped-def]
    """Every shipped file's spec is what transformers builds from its config today (costs: the slow
    benchmark ``benchmarks/derive_catalog.py`` regenerates them)."""
    import json

    doc = json.loads(path.read_text())
    if needs_timm(doc["config"]):
        pytest.importorskip("timm")
    spec = derive.derive_spec(doc["config"], name=doc["spec"]["name"])
    assert block_costs.spec_to_json(spec) == doc["spec"]


def test_there_is_shipped_data() -> None:
    assert len(SHIPPED_FILES) >= 20


@torch_only
@pytest.mark.parametrize("path", SHIPPED_FILES, ids=lambda p: p.stem)
def test_shipped_files_hold_every_shipped_family(derive, path) -> None:  # type: ignore[no-untyped-def]
    """Each file has the costs of every family ``train`` and ``fit`` ask for without a flag (full
    training per precision, LoRA and QLoRA with default adapters), measured at this COSTS_VERSION's
    layout, or says why a family could not be measured (fp32 experts: grouped_mm takes bf16 only)."""
    import json

    doc = json.loads(path.read_text())
    families = set(doc["costs"]) | set(doc.get("unmeasured_families", {}))
    assert doc["costs_version"] == block_costs.COSTS_VERSION
    assert families == set(derive.shipped_families())
    assert "mixed-bf16|sdpa|cuda|full" in doc["costs"]


# A sample of model types outside the formulas (an SSM + attention hybrid, interleaved sliding attention);
# benchmarks/derive_coverage.py runs the full table (issue 14: 3% median, 10% worst).
PARITY_SAMPLE = ("bamba", "cohere2")


@torch_only
@pytest.mark.slow
@pytest.mark.parametrize("model_type", PARITY_SAMPLE)
def test_derived_estimate_matches_a_real_cpu_step(derive, model_type) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from peakmem.estimate import estimate_training
    from peakmem.measure.runner import measure_training
    from peakmem.training import TrainingSetup

    config = derive.tiny_config(model_type)
    config.pop("architectures", None)
    spec = derive.derive_spec(config)
    assert spec.params == derive.model_params(derive.build_meta(config))
    setup = TrainingSetup(precision="fp32", seq_len=64, micro_batch=2, kernel_policy="cpu")
    if "sdpa" not in spec.attention_kernels:
        setup = replace(setup, attention="eager")
    real = measure_training(config, setup, device="cpu").peak_allocated_bytes
    est = estimate_training(spec, setup, costs=block_costs.provided_lookup).peak_allocated_bytes
    assert abs(est - real) <= 0.10 * real, (est, real)


@torch_only
@pytest.mark.slow
def test_every_causal_lm_type_that_builds_gets_its_exact_count(derive, capsys) -> None:  # type: ignore[no-untyped-def]
    """Issue 14: iterate over transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES; every type whose default
    config (shrunk where that still builds) builds gets the built model's exact parameter count; the
    ones that cannot build are listed with why (benchmarks/derive_coverage.md holds the same table)."""
    rows = [(t, *derive.check_type(t)) for t in derive.causal_lm_types()]
    wrong = [(t, why) for t, status, why, _ in rows if status in ("mismatch", "error")]
    cannot = [(t, why) for t, status, why, _ in rows if status == "cannot build"]
    with capsys.disabled():
        ok = len(rows) - len(cannot) - len(wrong)
        print(f"\n{ok} of {len(rows)} causal-LM model types: exact parameter count; cannot build:")
        for t, why in cannot:
            print(f"  {t}: {why}")
    assert not wrong
    assert len(cannot) <= len(rows) // 10  # transformers' own default configs that do not build


@torch_only
@pytest.mark.parametrize("method", ["full", "lora"])
def test_cut_model_measures_what_the_whole_one_does(derive, method) -> None:  # type: ignore[no-untyped-def]
    """Measuring 3 blocks of each kind gives the costs of the 8-block model (depth does not change a
    block's bytes; the cut only saves time)."""
    from peakmem.simulate.derive import step
    from peakmem.training import TrainingSetup

    setup = TrainingSetup(precision="mixed-bf16", method=method, seq_len=64, micro_batch=2)
    config = dict(LLAMA, num_hidden_layers=8)
    assert step.measure_one(config, setup, cut="select") == step.measure_one(config, setup, cut="none")


@torch_only
def test_cut_keeps_the_blocks_of_each_kind_not_a_prefix(derive) -> None:  # type: ignore[no-untyped-def]
    """A hybrid whose attention blocks sit deep (Granite 4.0-H: at 5, 15, 25, 35 of 40) is cut to the
    first three blocks of each kind, not to everything before the third attention block: the costs
    are those of the whole model, measured on 5 of its 8 blocks."""
    from peakmem.simulate.derive import build, step
    from peakmem.training import TrainingSetup

    kinds = ["linear_attention"] * 5 + ["full_attention", "linear_attention", "full_attention"]
    config = dict(derive.tiny_config("granitemoehybrid"), num_hidden_layers=8, layer_types=kinds)
    model = derive.build_meta(config)
    spec = derive.spec_from_model(model, config)
    keys = {f"model.layers.{i}": layer.derived.key for i, layer in enumerate(spec.layers())}
    kept = build.truncate(model, keys)
    assert kept is not None and len(model.model.layers) == 5
    chosen = (0, 1, 2, 5, 7)
    assert [kept[f"model.layers.{j}"] for j in range(5)] == [keys[f"model.layers.{i}"] for i in chosen]
    assert model.config.layer_types == [kinds[i] for i in chosen]
    # renumbered as the config's lists are cut (a cache is indexed by layer_idx)
    assert [m.layer_idx for m in model.modules() if isinstance(getattr(m, "layer_idx", None), int)][-1] == 4
    setup = TrainingSetup(precision="mixed-bf16", seq_len=64, micro_batch=2)
    whole = step.measure_one(config, setup, cut="none")
    assert step.measure_one(config, setup, cut="select") == whole
    # a long step keeps two blocks of its kinds (the second measured, and followed by one) and the first
    # of every other kind: 0, 1 and 5 here; the measured block's bytes are the same
    linear = keys["model.layers.0"]
    model = derive.build_meta(config)
    kept = build.truncate(model, keys, kinds=frozenset({linear}))
    assert kept is not None and list(kept.values())[-3:] == [keys[f"model.layers.{i}"] for i in (0, 1, 5)]
    only = step.measure_one(config, setup, cut="select", kinds=frozenset({linear}))
    assert only[linear] == whole[linear]


@torch_only
def test_steps_run_side_by_side_measure_what_one_after_another_do(derive, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A family's fake steps run in forked processes, one per CPU: each gives what it gives run in this
    process, in the order asked (the longest runs first)."""
    from peakmem.simulate.derive import forked
    from peakmem.training import TrainingSetup

    tasks = [(TrainingSetup(micro_batch=b, seq_len=s), None) for b, s in ((2, 32), (1, 64), (2, 64))]
    monkeypatch.setattr(forked, "_workers", lambda: 2)
    side_by_side = forked.measure_steps(dict(LLAMA), tasks)
    assert side_by_side == [forked.measure_once(dict(LLAMA), *task) for task in tasks]
    assert side_by_side[0] != side_by_side[2]


class _LibraryError(Exception):
    """An exception type with arguments of its own: pickled, it would not unpickle in the parent."""

    def __init__(self, what: str, where: int) -> None:
        super().__init__(f"{what} at {where}")


def test_a_forked_step_that_fails_is_a_named_input_error(derive, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A step that fails in a forked process with a library's own exception comes back as the same
    named InputError a step in this process gives."""
    from peakmem.errors import InputError
    from peakmem.simulate.derive import forked

    def broken(config, setup, *, cut, kinds=None):  # type: ignore[no-untyped-def]
        raise _LibraryError("no kernel", 3)

    monkeypatch.setattr(forked, "measure_one", broken)
    monkeypatch.setattr(forked, "_workers", lambda: 2)
    monkeypatch.setattr(forked, "_CUT_THAT_RUNS", {})
    family = family_key(precision="bf16", kernel="sdpa", policy="cuda", method="full")
    with pytest.raises(
        InputError, match=r"failed under full \(bf16\): RuntimeError: _LibraryError: no kernel at 3"
    ):
        derive.measure_costs(dict(LLAMA), family)


@torch_only
def test_fp32_experts_on_grouped_mm_are_a_named_input_error(derive) -> None:  # type: ignore[no-untyped-def]
    """OLMoE's experts run torch._grouped_mm, which takes bf16 only: fp32 expert weights (fp32,
    amp-bf16) are an InputError naming the precision and the model type, not a traceback."""
    from peakmem.errors import InputError
    from peakmem.simulate.derive import forked

    tiny = {"model_type": "olmoe", "architectures": ["OlmoeForCausalLM"], "vocab_size": 128,
            "hidden_size": 32, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2}  # fmt: skip
    from peakmem.training import Precision, TrainingSetup

    with pytest.raises(InputError, match=r"precision='fp32'.*olmoe.*grouped_mm"):
        derive.measure_costs(tiny, family_key(precision="fp32", kernel="sdpa", policy="cuda",
                                                      method="full"))  # fmt: skip
    # bf16 runs: one step of the family's (a whole family's costs took 20 s of the suite)
    assert forked.measure_once(tiny, TrainingSetup(precision=Precision.BF16, micro_batch=1, seq_len=64))


def test_a_step_that_fails_under_a_method_is_a_named_input_error(derive, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """transformers / peft code that cannot run a setup (peft's LoRA Linear around Llama 4's router,
    which returns a tuple) is an InputError naming the model type and the method: the shipped data
    records it as unmeasured, and ``train``'s ranked changes leave that method out instead of failing."""
    from peakmem.errors import InputError
    from peakmem.simulate.derive import forked

    def broken(config, setup, *, cut, kinds=None):  # type: ignore[no-untyped-def]
        raise AttributeError("'tuple' object has no attribute 'dtype'")

    monkeypatch.setattr(forked, "measure_one", broken)
    family = family_key(precision="bf16", kernel="sdpa", policy="cuda", method="full")
    with pytest.raises(InputError, match=r"model_type='llama'.*failed under full \(bf16\): AttributeError"):
        derive.measure_costs(dict(LLAMA), family)


def test_costs_cached_by_an_older_measurement_are_measured_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """Costs fitted over the old shapes (no ``costs_version``) are not read back: measured again."""
    import json

    monkeypatch.setenv(block_costs.CACHE_ENV, str(tmp_path))
    cost = block_costs.BlockCost(saved=block_costs.Fit(per_token=Fraction(3)))
    block_costs._write_cache("abc", "fp32|sdpa|cpu|full", {"k": cost})
    path = block_costs._cache_file("abc", "fp32|sdpa|cpu|full")
    body = json.loads(path.read_text())
    assert body["costs_version"] == block_costs.COSTS_VERSION
    del body["costs_version"]
    path.write_text(json.dumps(body))
    assert block_costs._read_cache("abc", "fp32|sdpa|cpu|full") is None


def test_flash_scratch_is_measured_unpadded_for_the_fit() -> None:
    """The block measurement sees flash's backward scratch at S rows (a per-token term the fit can
    carry); simulate keeps CUDA's padding to 128 rows. B = 2, 4 q heads over 2 k/v heads of 16, S = 32."""
    torch = pytest.importorskip("torch")
    from peakmem.simulate import kernels

    q, k = torch.empty(2, 4, 32, 16, dtype=torch.bfloat16), torch.empty(2, 2, 32, 16, dtype=torch.bfloat16)
    padded = kernels._flash_bwd_scratch(q, k)
    unpadded = kernels._flash_bwd_scratch(q, k, pad_rows=False)
    expanded = 2 * (2 * 32 * 4 * 16 * 2)  # dk/dv_expanded, bf16
    assert sum(t.nbytes for t in padded) == 2 * 4 * 128 * 4 + 2 * 128 * 4 * 32 * 4 + expanded
    assert sum(t.nbytes for t in unpadded) == 2 * 4 * 32 * 4 + 2 * 32 * 4 * 32 * 4 + expanded


@torch_only
@pytest.mark.slow
def test_costs_give_back_shapes_they_were_not_fitted_at(derive) -> None:  # type: ignore[no-untyped-def]
    """Tiny Falcon (multi-query attention on SDPA's math kernel: its one k/v head broadcast is a view
    at micro-batch 1, a copy above): the costs fitted over SHAPES and micro-batch 1's own give back
    direct measurements at a longer sequence, a larger batch and micro-batch 1, peak for peak (a fit
    through the five peaks missed each: 0.956 of simulate's peak at batch 2 x 128, bloom and gemma2
    off at 8 x 256 too)."""
    from peakmem.simulate.derive import forked
    from peakmem.training import TrainingSetup
    from tiny_models import FAMILY_CONFIGS

    config = FAMILY_CONFIGS["falcon"]
    family = family_key(precision="mixed-bf16", kernel="sdpa", policy="cuda", method="full")
    costs = derive.measure_costs(config, family)
    assert any(c.batch1 is not None for c in costs.values())
    for b, s in ((8, 256), (1, 256), (3, 96)):
        measured = forked.measure_once(dict(config), TrainingSetup(micro_batch=b, seq_len=s))
        for key, m in measured.items():
            at = block_costs.block_key_costs(costs, key).at(b, s, m.grads)  # type: ignore[union-attr]
            assert (at.saved, at.forward_transient, at.backward_transient) == m.peaks[:3], (key, b, s)


@torch_only
def test_train_measures_only_its_own_family(derive, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 14 (first train <= 60 s): ``train`` of a new family measures the block costs of the setup
    asked for only; the ways in other setup families are named as not measured yet, and are
    estimated once their costs are cached."""
    from dataclasses import replace

    from peakmem.formulas.activations import derived_family
    from peakmem.planner.ways import NOT_MEASURED_WHY, train_answer
    from peakmem.resolve import spec_for_config
    from peakmem.training import TrainingSetup

    measured: list[str] = []

    def provider(config, family):  # type: ignore[no-untyped-def]
        measured.append(family)
        return derive.measure_costs(config, family)

    monkeypatch.setattr(block_costs, "_PROVIDER", [provider])
    monkeypatch.setattr(block_costs, "_MEMORY", {})
    spec = spec_for_config(derive.tiny_config("smollm3"), name="tiny-smollm3", derive=derive.derive_spec)
    setup = TrainingSetup(precision="fp32", seq_len=64, micro_batch=2, kernel_policy="cpu")
    answer = train_answer(spec, setup, costs=block_costs.provided_lookup)
    assert measured == ["fp32|sdpa|cpu|full"]
    assert answer.ways.not_measured == ("method lora", "method qlora")
    assert not any(w.setup.method.value != "full" for w in answer.ways.ways)
    assert answer.ways.note.endswith(f"method lora, method qlora: {NOT_MEASURED_WHY}")
    train_answer(spec, replace(setup, method="lora"), costs=block_costs.provided_lookup)  # measures, caches
    again = train_answer(spec, setup, costs=block_costs.provided_lookup)
    assert again.ways.not_measured == ("method qlora",)  # LoRA estimated from the cache, measured once
    assert measured == ["fp32|sdpa|cpu|full", derived_family(replace(setup, method="lora"))]


@torch_only
@pytest.mark.slow
def test_a_chunked_kernel_gets_costs_of_its_own_for_long_sequences(derive) -> None:  # type: ignore[no-untyped-def]
    """Mamba-2's torch path pads the sequence to whole chunks (``mamba_chunk_size`` 256), so below a few
    chunks a block's bytes are a step function of the sequence and the short shapes' fit extrapolates
    wrongly (Granite 4.0-H's Mamba-2 block: 0.68x its saved bytes at 2 x 512). The block gets costs
    fitted over whole chunks (``BlockCost.long``, 512-2048 tokens, measured on the long cut: two blocks
    of its kind, one of every other) that give back lengths they were not fitted at, peak for peak, on
    the model cut as usual: 2 x 4096 and 1 x 3072 exactly, 4 x 2048 within 0.5% (0.18% under: the fit's
    terms do not carry all of the chunked scan's bytes)."""
    import dataclasses

    from peakmem.formulas.activations import derived_family
    from peakmem.simulate.derive import forked
    from peakmem.training import TrainingSetup

    config = derive.tiny_config("granitemoehybrid")
    costs = derive.measure_costs(config, derived_family(TrainingSetup()))
    longs = [k for k, c in costs.items() if c.long is not None]
    assert longs
    for batch, seq in ((2, 4096), (1, 3072), (4, 2048)):
        measured = forked.measure_once(config, TrainingSetup(micro_batch=batch, seq_len=seq))
        for key in longs:
            m = measured[key]
            at = costs[key].at(batch, seq, m.grads)
            short_only = dataclasses.replace(costs[key], long=None).at(batch, seq, m.grads)
            assert short_only.saved != m.saved
            if batch == 4:
                assert abs(at.saved - m.saved) <= 0.005 * m.saved
                assert (at.forward_transient, at.backward_transient) == m.peaks[1:3]
            else:
                assert (at.saved, at.forward_transient, at.backward_transient) == m.peaks[:3]


def test_flash_shares_sdpa_measurement_only_where_the_class_has_sdpa() -> None:
    """A derived model's flash family is measured as SDPA's (one measurement for both) where transformers
    has an SDPA path; a class without one (gpt-oss, Gemma 2) runs eager when asked for SDPA, so its flash
    family is its own (measured with SDPA standing in: derive/build.py build_with)."""
    from peakmem.formulas.activations import derived_family
    from peakmem.training import AttentionKernel, TrainingSetup

    flash = TrainingSetup(attention=AttentionKernel.FLASH)
    assert derived_family(flash) == derived_family(TrainingSetup(attention=AttentionKernel.SDPA))
    assert derived_family(flash, ("eager", "flash")).split("|")[1] == "flash"
