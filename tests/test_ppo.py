"""PPO with a critic (peakmem.ppo, verl's phases): hand-derived terms on the tiny Llama of tiny_models.

Tiny Llama: vocab V = 1000, hidden H = 64, 2 layers, untied head (tiny_models.LLAMA_P parameters). The
job: batch B = 2 sequences of L = 32 tokens, the last R = 16 the response, fp32, CPU kernel rules.
"""

from __future__ import annotations

import pytest

from peakmem.breakdown import Phase
from peakmem.errors import InputError
from peakmem.estimate import estimate_training
from peakmem.formulas.activations.shapes import shapes
from peakmem.formulas.logprob_head import VERL_BACKWARD_TILES, logits_logprob_head, logits_no_grad_bytes
from peakmem.formulas.loss import head_activations
from peakmem.jobs import estimate_post_training
from peakmem.parallel import Parallelism
from peakmem.post_training import Reference, post_training
from peakmem.ppo import critic_setup, critic_spec
from peakmem.resolve import spec_for_config
from peakmem.training import KernelPolicy, LossImpl, Method, Precision, TrainingSetup
from tiny_models import LLAMA, LLAMA_BUFFER_BYTES, LLAMA_P

V, H, B, L, R = 1000, 64, 2, 32, 16
SPEC = spec_for_config(dict(LLAMA))
SETUP = TrainingSetup(precision=Precision.FP32, micro_batch=B, seq_len=L, kernel_policy=KernelPolicy.CPU)


def _post(method: str = "full", **kw: object) -> object:
    return post_training("ppo", completion=R, seq=L, batch=B, adapter=method != "full", **kw)  # type: ignore[arg-type]


def test_critic_is_the_backbone_with_a_scalar_value_head() -> None:
    # the untied LM head (V x H) is replaced by score = Linear(H, 1) with a bias (H + 1)
    critic = critic_spec(SPEC)
    assert critic.params == LLAMA_P - V * H + H + 1 == 156_545
    assert critic.task == "token-value" and critic.num_labels == 1
    # a tied head (no tensor of its own) keeps the embedding and adds the score head
    tied = spec_for_config(dict(LLAMA, tie_word_embeddings=True))
    assert critic_spec(tied).params == tied.params + H + 1


def test_value_head_saves_its_input_and_no_vocabulary() -> None:
    critic = critic_spec(SPEC)
    head = head_activations(critic, shapes(critic, critic_setup(SETUP)), H)
    saved = {i.key: i.bytes for i in head.saved}
    assert saved["head.score_input"] == B * L * H * 4  # score's input, fp32
    assert "loss.log_softmax" not in saved
    assert head.forward_transient == head.logits_grad == B * L * 1 * 4  # the [B, L, 1] values
    assert head.backward_transient == 0


def test_critic_update_is_a_full_training_step_with_its_own_states() -> None:
    lora = TrainingSetup(precision=Precision.FP32, micro_batch=B, seq_len=L, method=Method.LORA)
    assert critic_setup(lora).method is Method.FULL and critic_setup(lora).loss is LossImpl.STANDARD
    est = estimate_training(critic_spec(SPEC), critic_setup(SETUP))
    assert est.trainable_params == 156_545


@pytest.mark.parametrize("r", [16, 4])
def test_verl_logits_then_logprob_terms(r: int) -> None:
    sh = shapes(SPEC, SETUP)
    base = head_activations(SPEC, sh, V * H)
    head = logits_logprob_head(SPEC, base, sh, scored=r, entropy=False)
    saved = {i.key: i.bytes for i in head.saved}
    logits, rows = B * L * V * 4, B * r * V * 4
    assert saved["loss.verl_logits"] == logits  # every row's logsumexp saves a view of the fp32 logits
    assert "loss.log_softmax" not in saved and saved["head.lm_head_input"] == B * L * H * 4
    assert head.forward_transient == 0  # the logits are the saved tensor; nothing else is [*, V]
    # three [B, R, V] gradients beside the saved logits, or the [B, L, V] gradient and its copy by the
    # temperature's division once the logits are freed: 3 x 16 > 2 x 32 - 32 rows, 3 x 4 < 32
    assert head.backward_transient == max(VERL_BACKWARD_TILES * rows, logits)
    assert head.logits_grad == 0
    ent = logits_logprob_head(SPEC, base, sh, scored=r, entropy=True)
    assert {i.key: i.bytes for i in ent.saved}["loss.verl_logits"] == logits + rows  # + softmax
    assert ent.forward_transient == rows  # softmax(z) * z
    assert ent.backward_transient == max(5 * rows, 2 * logits - (logits + rows))


def test_verl_head_16_bit_logits_keep_the_rows_log_softmax() -> None:
    setup = TrainingSetup(precision=Precision.BF16, micro_batch=B, seq_len=L, kernel_policy=KernelPolicy.CPU)
    sh = shapes(SPEC, setup)
    head = logits_logprob_head(SPEC, head_activations(SPEC, sh, V * H), sh, scored=R, entropy=False)
    logits, rows = B * L * V * 2, B * R * V * 2
    assert {i.key: i.bytes for i in head.saved}["loss.verl_logits"] == rows
    assert head.forward_transient == logits  # the logits are a temporary
    assert head.logits_grad == logits - rows
    assert head.backward_transient == max(3 * rows, 2 * logits - rows)


def test_no_grad_logprob_pass() -> None:
    logits, hidden, rows = B * L * V * 4, B * L * H * 4, B * R * V * 4
    assert logits_no_grad_bytes(SPEC, B, L, R, 4, entropy=False) == logits + hidden
    assert logits_no_grad_bytes(SPEC, B, L, R, 4, entropy=True) == logits + 2 * rows


def test_phases_in_verls_order_with_the_critic_resident() -> None:
    post = _post()
    assert post.reference is Reference.NONE  # beta 0: verl's use_kl_loss / use_kl_in_reward off
    est = estimate_post_training(SPEC, SETUP, post)
    assert [p.phase for p in est.phases] == [
        Phase.ROLLOUT, Phase.SCORING, Phase.CRITIC_UPDATE, Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER,
    ]  # fmt: skip
    critic = estimate_training(critic_spec(SPEC), critic_setup(SETUP))
    resident = 156_545 * 4 * 3 + LLAMA_BUFFER_BYTES  # fp32 weights, AdamW m and v; the rotary buffers
    for p in est.phases:
        items = {i.key: i.bytes for i in p.items}
        if p.phase is not Phase.CRITIC_UPDATE:
            assert items["critic.resident"] == resident
        else:
            critic_bytes = sum(i.bytes for i in p.items if i.key.startswith("critic."))
            assert critic_bytes == critic.peak_allocated_bytes  # the critic's own step, at its peak
            assert p.bytes - critic_bytes == items["policy.resident"] + items["policy.generation_batch"]
    # the kept batch: ids and mask over L (int64), six fp32 vectors over R
    kept = {i.key: i.bytes for i in est.phases[1].items}["policy.generation_batch"]
    assert kept == B * (L * 2 * 8 + R * 6 * 4)
    assert est.extra["phases_by_role"]["critic update"]["critic"] > 0


def test_reference_follows_beta_and_the_adapter() -> None:
    assert _post(beta=0.001).reference is Reference.SEPARATE
    lora = _post("lora", beta=0.001)
    assert lora.reference is Reference.ADAPTER
    with_ref = estimate_post_training(SPEC, SETUP, _post(beta=0.001))
    ref = {i.key: i.bytes for i in with_ref.phases[0].items}["reference.weights"]
    assert ref == LLAMA_P * 4


def test_several_gpus_is_a_one_line_error() -> None:
    with pytest.raises(InputError) as err:
        estimate_post_training(SPEC, SETUP, _post(), par=Parallelism(gpus=2, zero_stage=3))
    assert str(err.value).startswith("gpus=2") and "\n" not in str(err.value)


def test_a_chosen_critic_backbone() -> None:
    wider = spec_for_config(dict(LLAMA, hidden_size=128, intermediate_size=352, num_attention_heads=8))
    post = _post(critic=wider)
    est = estimate_post_training(SPEC, SETUP, post)
    assert est.extra["critic_params"] == critic_spec(wider).params
    assert est.setup["post_training"]["critic"] == wider.name
    with pytest.raises(InputError) as err:
        post_training("grpo", num_generations=2, completion=R, seq=L, batch=B, critic=wider)
    assert str(err.value).startswith("critic=") and "\n" not in str(err.value)


def test_ppo_through_the_options() -> None:
    import peakmem

    out = peakmem.train("llama-3.2-1b", objective="ppo", seq=1024, critic="qwen2.5-0.5b")
    assert out["peak_phase"] in {p.value for p in Phase}
    assert "critic update" in out["phases"]
    assert out["setup"]["post_training"]["critic"] == "qwen2.5-0.5b"


def test_entropy_is_ppos_and_turns_the_actors_entropy_on() -> None:
    est = estimate_post_training(SPEC, SETUP, _post(entropy=True))
    plain = estimate_post_training(SPEC, SETUP, _post())
    fwd = {p.phase: p for p in est.phases}[Phase.FORWARD]
    saved = sum(i.bytes for i in fwd.items if i.key == "loss.verl_logits")
    assert saved == B * L * V * 4 + B * R * V * 4  # the logits and the softmax
    bwd = {p.phase: p.bytes for p in est.phases}[Phase.BACKWARD]
    assert bwd > {p.phase: p.bytes for p in plain.phases}[Phase.BACKWARD]
    assert est.setup["post_training"]["entropy"] is True
    with pytest.raises(InputError) as err:
        post_training("grpo", num_generations=2, completion=R, seq=L, batch=B, entropy=True)
    assert str(err.value).startswith("entropy=True") and "\n" not in str(err.value)
    verl = post_training(
        "grpo", num_generations=2, completion=R, seq=L, batch=B, entropy=True, trainer="verl"
    )
    assert verl is not None and verl.entropy  # verl's GRPO runs the same actor


def _verl_grpo(**kw: object) -> object:
    return post_training("grpo", num_generations=2, completion=R, seq=L, batch=B, trainer="verl", **kw)  # type: ignore[arg-type]


def test_verl_grpo_runs_verls_loop_without_a_critic() -> None:
    """``--trainer verl`` GRPO: rollout, scoring (the actor's old log-probs with the entropy, the
    reference's), then the actor's update with verl's logits-then-log-prob loss; no critic, no values, and
    a kept batch of four fp32 vectors over R (mask, scores, old log-probs, advantages = returns) plus the
    reference's log-probs."""
    post = _verl_grpo(beta=0.001)
    est = estimate_post_training(SPEC, SETUP, post)
    assert [p.phase for p in est.phases] == [
        Phase.ROLLOUT, Phase.SCORING, Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER,
    ]  # fmt: skip
    assert not any(i.key.startswith("critic.") for p in est.phases for i in p.items)
    assert set(est.extra["scoring_passes"]) == {"old log-probs (actor)", "reference log-probs"}
    kept = {i.key: i.bytes for i in est.phases[1].items}["policy.generation_batch"]
    assert kept == B * (L * 2 * 8 + R * (4 + 1) * 4)
    fwd = {p.phase: p for p in est.phases}[Phase.FORWARD]
    assert sum(i.bytes for i in fwd.items if i.key == "loss.verl_logits") == B * L * V * 4  # the full logits
    trl = estimate_post_training(SPEC, SETUP, post_training("grpo", num_generations=2, completion=R, seq=L,
                                                            batch=B, beta=0.001))  # fmt: skip
    assert not any(i.key == "loss.verl_logits" for p in trl.phases for i in p.items)  # TRL: the fused head
    assert est.setup["post_training"]["trainer"] == "verl"


def test_verl_grpo_on_several_gpus_shards_the_actor() -> None:
    """Data parallel verl GRPO (FSDP full shard over 2 ranks): the actor's update is the most loaded rank's;
    PPO's critic is not sharded yet, so PPO stays a one-line error there."""
    from peakmem.parallel import FsdpMode

    par = Parallelism(gpus=2, fsdp=FsdpMode.FULL_SHARD)
    one = estimate_post_training(SPEC, SETUP, _verl_grpo())
    two = estimate_post_training(SPEC, SETUP, _verl_grpo(), par=par)
    assert two.peak_allocated_bytes < one.peak_allocated_bytes
    assert Phase.CRITIC_UPDATE not in {p.phase for p in two.phases}


def test_the_trainer_is_checked() -> None:
    with pytest.raises(InputError) as err:
        post_training("dpo", completion=R, seq=L, batch=B, trainer="verl")
    assert str(err.value).startswith("trainer='verl'") and "\n" not in str(err.value)
    with pytest.raises(InputError) as err:
        post_training("grpo", num_generations=2, completion=R, seq=L, batch=B, trainer="openrlhf")
    assert str(err.value).startswith("trainer=") and "\n" not in str(err.value)


def test_scoring_passes_hold_their_autocast_weight_casts() -> None:
    """Under autocast a no-grad pass caches the 16-bit casts of the weights that require grad: a full
    actor's every Linear (the head's V x H and each layer's, 2 bytes each), a LoRA actor's adapters only."""
    amp = TrainingSetup(
        precision=Precision.AMP_BF16, micro_batch=B, seq_len=L, kernel_policy=KernelPolicy.CPU
    )
    layers = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 176)  # q, k, v, o, gate, up, down
    full = estimate_post_training(SPEC, amp, _post())
    plain = estimate_post_training(SPEC, SETUP, _post())
    actor = full.extra["scoring_passes"]["old log-probs (actor)"]
    no_cast = actor - (V * H + layers) * 2
    assert no_cast == B * L * V * 2 + 2 * B * R * V * 2  # 16-bit logits, softmax and product (entropy)
    assert plain.extra["scoring_passes"]["old log-probs (actor)"] == B * L * V * 4 + 2 * B * R * V * 4
    lora_setup = TrainingSetup(
        precision=Precision.AMP_BF16,
        micro_batch=B,
        seq_len=L,
        kernel_policy=KernelPolicy.CPU,
        method=Method.LORA,
    )
    lora = estimate_post_training(SPEC, lora_setup, _post("lora"))
    # no entropy for a LoRA actor (calculate_entropy = not is_lora): the logits beside the final hidden
    expected = 2 * lora.trainable_params + B * L * V * 2 + B * L * H * 2
    assert lora.extra["scoring_passes"]["old log-probs (actor)"] == expected
