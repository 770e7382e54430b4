"""LoRA on transformers 4.x MoE models, whose experts are one nn.Linear per expert and projection
(formulas/lora/targets.py): hand-derived counts and saved bytes on tiny specs, transformers 4.48.1 vs 5.x,
and the adapters' saved tensors measured on CPU on a tiny per-expert MoE block run through peft."""

from __future__ import annotations

from typing import Any

import pytest

from peakmem.adapters import LoraConfig
from peakmem.errors import InputError
from peakmem.formulas import lora as L
from peakmem.hf import spec_from_config
from peakmem.model import ModelSpec
from peakmem.training import Method, TrainingSetup

H, W, E, K, R = 64, 32, 4, 2, 2  # hidden, expert width, experts, top-k, LoRA rank
QWEN2_MOE = {
    "model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "vocab_size": 128, "hidden_size": H,
    "intermediate_size": 96, "moe_intermediate_size": W, "shared_expert_intermediate_size": 48,
    "num_experts": E, "num_experts_per_tok": K, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2,
}  # fmt: skip
MIXTRAL = {
    "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "vocab_size": 128, "hidden_size": H,
    "intermediate_size": W, "num_local_experts": E, "num_experts_per_tok": K, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2,
}  # fmt: skip
MLP_NAMES = ("gate_proj", "up_proj", "down_proj")


def _spec(cfg: dict[str, Any]) -> ModelSpec:
    return spec_from_config(cfg, name="tiny")


def _v4(**kw: Any) -> LoraConfig:
    return LoraConfig(rank=R, expert_linears=True, **kw)


def test_each_expert_linear_gets_its_adapter() -> None:
    """Qwen2-MoE, gate/up/down: per layer E experts x (gate H->W, up H->W, down W->H) plus the shared
    expert's three (H->48, H->48, 48->H); transformers 5 (no peft conversion for qwen2_moe): the shared
    expert only."""
    s = _spec(QWEN2_MOE)
    experts = E * (2 * R * (H + W) + R * (W + H))
    shared = 2 * R * (H + 48) + R * (48 + H)
    assert L.trainable_params(s, _v4(targets=MLP_NAMES)) == 2 * (experts + shared)
    assert L.trainable_params(s, LoraConfig(rank=R, targets=MLP_NAMES)) == 2 * shared
    # every tensor is one of E per-expert copies (their optimizer states and gradients follow)
    tensors = [t for t, _n in L.adapter_tensors(s, _v4(targets=("down_proj",))) if t.copies > 1]
    assert {(t.module, t.shape, t.copies) for t in tensors} == {("lora_A", (R, W), E), ("lora_B", (H, R), E)}
    assert L.layer_trainable_params(s, _v4(targets=("down_proj",)), 0) == E * R * (W + H) + R * (48 + H)


def test_all_linear_takes_the_router_linears() -> None:
    """all-linear on 4.x Qwen2-MoE: attention, experts, shared expert, the router Linear (H -> E) and
    shared_expert_gate (H -> 1); never the LM head."""
    s = _spec(QWEN2_MOE)
    attn = (H + H) + 2 * (H + 32) + (H + H)
    experts = E * 3 * (H + W)
    shared = 3 * (H + 48)
    routers = (H + E) + (H + 1)
    assert L.trainable_params(s, _v4()) == 2 * R * (attn + experts + shared + routers)
    leaves = {m.leaf for m in L.resolve_targets(s, _v4())}
    assert "lm_head" not in leaves and {"gate", "shared_expert_gate", "gate_proj"} <= leaves


def test_mixtral_w_names_match_one_by_one() -> None:
    """Mixtral's 4.x experts are w1 (gate), w3 (up), w2 (down): each alone is a valid target (transformers
    5 fuses w1 and w3, so w1 alone is refused there); 'gate' is the router Linear."""
    s = _spec(MIXTRAL)
    assert L.trainable_params(s, _v4(targets=("w1",))) == 2 * E * R * (H + W)
    assert L.trainable_params(s, _v4(targets=("w2",))) == 2 * E * R * (W + H)
    assert L.trainable_params(s, _v4(targets=("gate",))) == 2 * R * (H + E)
    with pytest.raises(InputError, match="w3"):
        L.resolve_targets(s, LoraConfig(rank=R, targets=("w1",)))


def test_setup_that_runs_marks_the_release() -> None:
    from peakmem.step_setup import setup_that_runs

    s = _spec(MIXTRAL)
    cases = (("4.48.1", Method.LORA, True), ("5.0.0", Method.LORA, False), ("4.48.1", Method.QLORA, True),
             ("4.48.1", Method.FULL, False))  # fmt: skip
    for version, method, want in cases:
        ran = setup_that_runs(s, TrainingSetup(method=method, transformers=version))
        assert (ran.lora is not None and ran.lora.expert_linears) is want, (version, method)
    dense = spec_from_config({**MIXTRAL, "model_type": "mistral", "architectures": ["MistralForCausalLM"]})
    ran = setup_that_runs(dense, TrainingSetup(method=Method.LORA, transformers="4.48.1"))
    assert ran.lora is None or not ran.lora.expert_linears


def test_bad_input() -> None:
    s = _spec(QWEN2_MOE)
    fused = r"^lora_target_parameters='mlp\.experts\.gate_up_proj'.*nn\.Linear per"
    with pytest.raises(InputError, match=fused):
        L.resolve_targets(s, _v4(targets=("q_proj",), target_parameters=("mlp.experts.gate_up_proj",)))
    with pytest.raises(InputError, match="matches no module") as err:
        L.resolve_targets(s, _v4(targets=("w1",)))
    assert "gate_proj" in str(err.value) and "\n" not in str(err.value)
    ds = spec_from_config({
        **QWEN2_MOE, "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
        "n_routed_experts": E, "first_k_dense_replace": 0, "q_lora_rank": None, "kv_lora_rank": 16,
        "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "n_shared_experts": 1, "n_group": 1,
        "topk_group": 1,
    })  # fmt: skip
    with pytest.raises(InputError, match="router holding a bare Parameter"):
        L.resolve_targets(ds, _v4(targets=("gate",)))  # DeepSeek-V3's 4.x router is no Linear either


def _saved(lora: LoraConfig, tokens: int = 64) -> dict[str, int]:
    """Saved bytes by key of the MoE layer of tiny Qwen3-MoE (no shared expert), mixed-bf16, CUDA."""
    from peakmem.formulas.activations import layer_activations, shapes

    s = _spec({**QWEN2_MOE, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
               "head_dim": 16, "shared_expert_intermediate_size": 0})  # fmt: skip
    setup = TrainingSetup(micro_batch=2, seq_len=tokens // 2, method=Method.LORA, lora=lora)
    sh = shapes(s, setup)
    la = layer_activations(s, s.groups[0].layer, sh)
    return {i.key: i.bytes for i in L.adapt_layer(s, 0, la, sh, setup).saved}


def test_expert_adapters_run_on_the_routed_rows() -> None:
    """Each expert's adapter sees only its routed tokens: over the experts, one adapter path on T x k rows.
    Dropout 0.1, fp32 adapters on a bf16 base (CUDA: bool mask): gate and up each keep the dropout output
    (rows x H x 4) and mask (rows x H), down (rows x W x 5); each lora_A output rows x r x 4. lora_A never
    reads the gathered rows or the act * up product themselves, so the frozen experts drop both."""
    t = 64
    rows = t * K
    base = _saved(LoraConfig(rank=R, targets=("q_proj",)))
    got = _saved(_v4(targets=MLP_NAMES, dropout=0.1))
    assert got["lora.adapter_inputs"] == 2 * rows * H * 5 + rows * W * 5
    assert got["lora.a_outputs"] == 3 * rows * R * 4
    assert "moe.routed_inputs" not in got and got["mlp.interior"] == base["mlp.interior"]
    # bf16 adapters, no dropout: lora_A reads the routed rows and the down input themselves (kept)
    same = _saved(_v4(targets=MLP_NAMES, adapter_dtype="base"))
    assert "lora.adapter_inputs" not in same and same["lora.a_outputs"] == 3 * rows * R * 2
    assert same["moe.routed_inputs"] == rows * H * 2
    assert same["mlp.interior"] == base["mlp.interior"] + rows * W * 2


# --- CPU check: a 4.x-style MoE block (per-expert Linears, the 4.48.1 routing loop) under peft ---------
def _cpu_saved_bytes(peft_targets: list[str] | None, dropout: float) -> tuple[int, int]:
    """(bytes of the non-parameter storages autograd saves in one forward, trainable parameters)."""
    import torch
    from torch import nn

    class Expert(nn.Module):  # 4.48.1 modeling_qwen2_moe.py Qwen2MoeMLP
        def __init__(self) -> None:
            super().__init__()
            self.gate_proj = nn.Linear(H, W, bias=False)
            self.up_proj = nn.Linear(H, W, bias=False)
            self.down_proj = nn.Linear(W, H, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    class Block(nn.Module):  # 4.48.1 Qwen2MoeSparseMoeBlock.forward l. 619-651, without the shared expert
        def __init__(self) -> None:
            super().__init__()
            self.gate = nn.Linear(H, E, bias=False)
            self.experts = nn.ModuleList([Expert() for _ in range(E)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            weights = torch.softmax(self.gate(x), dim=1, dtype=torch.float)
            weights, selected = torch.topk(weights, K, dim=-1)
            out = torch.zeros_like(x)
            mask = nn.functional.one_hot(selected, num_classes=E).permute(2, 1, 0)
            for e in range(E):
                idx, top_x = torch.where(mask[e])
                y = self.experts[e](x[None, top_x].reshape(-1, H)) * weights[top_x, idx, None]
                out = out.index_add(0, top_x, y)
            return out

    torch.manual_seed(0)
    model: nn.Module = Block().requires_grad_(False)
    if peft_targets is not None:
        import peft

        cfg = peft.LoraConfig(r=R, lora_alpha=R, target_modules=peft_targets, lora_dropout=dropout)
        model = peft.get_peft_model(model, cfg)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(64, H, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return sum(seen.values()), sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.torch
def test_cpu_per_expert_lora_matches_the_formula() -> None:
    """peft on per-expert Linears (fp32, CPU): the trainable count is E x r(in + out) per projection, and
    what the adapters add to the saved tensors is :func:`adapter_saved_per_module` at T x k rows: dropout
    output, its mask (CPU: the input's dtype) and lora_A's output per projection."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    t, rows = 64, 64 * K
    frozen, _ = _cpu_saved_bytes(None, 0.0)
    lora, trainable = _cpu_saved_bytes(list(MLP_NAMES), 0.1)
    assert trainable == E * (2 * R * (H + W) + R * (W + H))
    m = {leaf: L.AdaptedModule(path=f"mlp.experts.{leaf}", kind="linear", in_features=i, out_features=o,
                               experts=1, group=0, component="experts", copies=E)
         for leaf, i, o in (("gate_proj", H, W), ("up_proj", H, W), ("down_proj", W, H))}  # fmt: skip
    cfg = LoraConfig(rank=R, dropout=0.1, expert_linears=True)
    want = sum(
        sum(L.adapter_saved_per_module(mod, cfg, tokens=rows, x_bytes=4, a_bytes=4, cuda=False))
        for mod in m.values()
    )
    assert lora - frozen == want
    del t
