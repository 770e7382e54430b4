"""``PeakmemCallback`` inside a real transformers 5.23 ``Trainer`` on the CPU, with the tiny Llama of
tests/tiny_models.py (220,480 parameters): a job that fits runs its steps with the prediction in the logs;
one that does not is stopped before its first step; a peft LoRA model maps to method lora; the callback's
answer equals ``peakmem train ... --json`` for the same setup.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import json
import os
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch
import transformers
from transformers import Trainer, TrainerCallback, TrainingArguments

from peakmem.errors import EXIT_DOES_NOT_FIT, InputError
from peakmem.integrations.transformers import DoesNotFitError, PeakmemCallback, job_from_trainer
from tiny_models import LLAMA, LLAMA_P

pytestmark = pytest.mark.torch

SEQ = 32
BATCH = 2
ROWS = 8  # examples in the dataset: 4 batches of 2
PREDICTED_KEYS = ("peakmem/predicted_allocated_gib", "peakmem/predicted_reserved_gib",
                  "peakmem/predicted_device_gib")  # fmt: skip


class _Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """ROWS causal-LM examples of SEQ tokens (labels = inputs, as DataCollatorForLanguageModeling)."""

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = (torch.arange(SEQ) * (i + 1)) % LLAMA["vocab_size"]
        return {"input_ids": ids, "labels": ids}


def _model() -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{k: v for k, v in LLAMA.items() if k != "model_type"})
    return transformers.LlamaForCausalLM(config)


def _args(tmp_path: Any, **kw: Any) -> TrainingArguments:
    base: dict[str, Any] = dict(
        output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=BATCH, report_to=[],
        save_strategy="no", logging_steps=1, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    base.update(kw)
    return TrainingArguments(**base)


def _train(model: Any, args: TrainingArguments, *callbacks: Any) -> Trainer:
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens(), callbacks=list(callbacks))
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    return trainer


def _weights(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


class _LogSpy(TrainerCallback):
    """Keeps the ``logs`` every on_log hands the callbacks after PeakmemCallback."""

    def __init__(self) -> None:
        self.logs: list[dict[str, Any]] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        self.logs.append(dict(logs or {}))


def test_a_job_that_fits_runs_its_steps_with_the_prediction_logged(tmp_path: Any, monkeypatch: Any) -> None:
    cb, spy = PeakmemCallback(gpu="80GB", quiet=True), _LogSpy()
    trainer = _train(_model(), _args(tmp_path, bf16=True), cb, spy)
    assert trainer.state.global_step == 2
    assert cb.job is not None and cb.json is not None
    s = cb.job.setup
    # HF Trainer bf16=True on fp32 weights is autocast; transformers 5.23's default optim is the fused AdamW
    assert (s.method.value, s.precision.value, s.optimizer.value, s.optimizer_impl.value) == (
        "full",
        "amp-bf16",
        "adamw",
        "fused",
    )
    assert (s.micro_batch, s.seq_len, s.grad_accum, s.checkpointing.value, s.attention.value) == (
        BATCH, SEQ, 1, "none", "sdpa")  # fmt: skip
    assert cb.json["model"]["params"] == LLAMA_P == 220_480
    assert cb.json["verdicts"][0]["fits"] is True
    first = trainer.state.log_history[0]
    assert first["step"] == 0
    predicted = cb.answer.estimate.peak_allocated_bytes
    assert first["peakmem/predicted_allocated_gib"] == round(predicted / 2**30, 4)
    assert set(PREDICTED_KEYS) <= set(first)
    # reading the first batch changed nothing: the same examples, in the same order, the same losses
    plain = _train(_model(), _args(tmp_path, bf16=True))
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == 2 and losses == [e["loss"] for e in plain.state.log_history if "loss" in e]
    # merged into the first on_log's logs too (with loss, grad_norm, ... at step 1); measured only on CUDA
    assert set(PREDICTED_KEYS) <= set(spy.logs[0]) and "loss" in spy.logs[0]
    assert not any("measured" in k for entry in trainer.state.log_history for k in entry)
    # the CUDA bookkeeping, with the allocator's answers given: 3 MiB measured against the prediction
    measured, reserved = 3 * 2**20, 4 * 2**20
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: measured)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: reserved)
    cb._device = "cuda:0"
    state = SimpleNamespace(global_step=1, log_history=[])
    cb.on_step_end(trainer.args, state, trainer.control)
    entry = state.log_history[0]
    assert entry["step"] == 1 and entry["peakmem/measured_allocated_gib"] == round(measured / 2**30, 4)
    assert entry["peakmem/error_pct"] == round(100 * (predicted - measured) / measured, 2)
    reserved_pred = cb.answer.estimate.peak_reserved_bytes
    assert entry["peakmem/reserved_error_pct"] == round(100 * (reserved_pred - reserved) / reserved, 2)
    state.global_step = 3
    cb.on_step_end(trainer.args, state, trainer.control)
    assert len(state.log_history) == 1  # only steps 1..measure_steps (2)


def test_a_job_that_will_not_fit_stops_before_the_first_step(tmp_path: Any, capsys: Any) -> None:
    model = _model()
    before = _weights(model)
    optimizer_steps: list[int] = []

    class _Spy(TrainerCallback):
        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            optimizer_steps.append(state.global_step)

    cb = PeakmemCallback(gpu="1MB")  # 1,000,000 B: parse_size's smallest sensible size is 1B
    trainer = Trainer(model=model, args=_args(tmp_path), train_dataset=_Tokens(), callbacks=[_Spy(), cb])
    with pytest.raises(DoesNotFitError) as err:
        trainer.train()
    assert trainer.state.global_step == 0 and optimizer_steps == []
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert err.value.exit_code == EXIT_DOES_NOT_FIT and err.value.capacity_bytes == 1_000_000
    assert err.value.estimate.device_total_bytes > 1_000_000
    out = capsys.readouterr().out
    assert "ways to bring it down" in out and "verdict" in out
    assert err.value.ways.ways and err.value.ways.ways[0].label in out


def test_the_flag_alone_lets_one_step_run(tmp_path: Any) -> None:
    """Why the callback raises: transformers 5.23's _run_epoch reads should_training_stop only after a
    micro-batch's forward, backward and optimizer step."""

    class _FlagOnly(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            control.should_training_stop = True

    trainer = _train(_model(), _args(tmp_path), _FlagOnly())
    assert trainer.state.global_step == 1


def test_a_peft_lora_model_maps_to_method_lora(tmp_path: Any) -> None:
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.05)
    model = peft.get_peft_model(_model(), lora)
    cb = PeakmemCallback(gpu="80GB", quiet=True)
    trainer = _train(model, _args(tmp_path, max_steps=1, bf16=True), cb)
    assert trainer.state.global_step == 1
    assert cb.job is not None and cb.json is not None
    s = cb.job.setup
    assert s.method.value == "lora" and s.precision.value == "amp-bf16"
    assert s.lora is not None
    assert (s.lora.rank, s.lora.alpha, s.lora.targets, s.lora.dropout, s.lora.adapter_dtype) == (
        4, 16.0, ("q_proj", "v_proj"), 0.05, "fp32")  # fmt: skip
    # per layer: q_proj A 4x64 + B 64x4, v_proj A 4x64 + B 32x4 (2 kv heads x 16); 2 layers
    assert cb.json["model"]["trainable_params"] == 2 * (4 * 64 + 64 * 4 + 4 * 64 + 32 * 4) == 1_792
    assert _cli_json(tmp_path, cb) == json.loads(json.dumps(cb.json))  # the LoRA flags say the same


def test_a_bitsandbytes_4bit_base_maps_to_qlora() -> None:
    """The mapping only (bitsandbytes 4-bit needs CUDA): the base's quantization_config is read."""
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_model(), peft.LoraConfig(r=8, target_modules="all-linear"))
    base = model.get_base_model()
    base.config.quantization_config = {
        "quant_method": "bitsandbytes",
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
    }
    args = SimpleNamespace(per_device_train_batch_size=4, optim="paged_adamw_8bit", bf16=True,
                           gradient_checkpointing=True, world_size=1)  # fmt: skip
    job = job_from_trainer(args, model, seq=512)
    s = job.setup
    assert (s.method.value, s.optimizer.value, s.checkpointing.value, s.seq_len) == (
        "qlora", "paged-adamw-8bit", "full", 512)  # fmt: skip
    assert s.quant is not None and (s.quant.quant, s.quant.double_quant) == ("nf4", True)
    # the installed bitsandbytes is the release the step runs (its MatMul4Bit's saved tensors: bnb_versions)
    installed = importlib.metadata.version("bitsandbytes")
    assert s.bitsandbytes == installed
    assert ("bitsandbytes", installed, "importlib.metadata.version('bitsandbytes')") in job.read
    # and the installed transformers, whose model code and loss the Trainer runs (transformers_versions)
    assert s.transformers == importlib.metadata.version("transformers")
    assert s.accelerate == importlib.metadata.version("accelerate")
    assert s.lora is not None and s.lora.rank == 8
    assert set(s.lora.targets) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }


def test_a_qlora_jobs_question_with_a_gpu_is_the_clis(tmp_path: Any) -> None:
    """The callback's question for a mapped QLoRA job answers as `peakmem train <its flags> --gpu h100`: the
    GPU's overheads included (Hopper's 32 MiB cuBLAS workspace; the total caps what the base's load may
    reserve: step_load)."""
    peft = pytest.importorskip("peft")
    from peakmem.cli import main
    from peakmem.integrations.transformers import job_question
    from peakmem.question import answer
    from peakmem.resolve import resolve_gpu

    # a bitsandbytes base keeps its other weights in bf16 (the flags name no float dtype for an fp32 one)
    lora = peft.LoraConfig(r=8, target_modules="all-linear")
    model = peft.get_peft_model(_model().to(torch.bfloat16), lora)
    model.get_base_model().config.quantization_config = {
        "quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
    }  # fmt: skip
    args = SimpleNamespace(per_device_train_batch_size=1, optim="adamw_torch", bf16=True, world_size=1)
    job = job_from_trainer(args, model, seq=16)
    got = answer(job_question(job, (resolve_gpu("h100"),))).json
    assert got["method"] == "analytic" and "load" in got["phases"]
    folder = tmp_path / job.name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(job.config))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["train", str(folder), *job.flags(), "--gpu", "h100", "--json"])
    cli = json.loads(out.getvalue())
    assert cli == json.loads(json.dumps(got))


def test_a_trl_trainer_passes_its_release(monkeypatch: Any) -> None:
    """Arguments of a TRL config class: the installed TRL release's rule gives the quantized base's
    kbit_prep (peakmem.trl_versions; 0.13.0 here, whose SFTTrainer prepares and casts back under bf16)."""
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_model(), peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    model.get_base_model().config.quantization_config = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    sft_config = type("SFTConfig", (SimpleNamespace,), {"__module__": "trl.trainer.sft_config"})
    args = sft_config(per_device_train_batch_size=4, optim="adamw_torch", bf16=True, world_size=1)
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.13.0" if name == "trl" else real(name))
    job = job_from_trainer(args, model, seq=64)
    assert job.setup.quant is not None and job.setup.quant.kbit_prep == "trl"
    assert ("trl", "0.13.0", "importlib.metadata.version('trl'), SFTConfig") in job.read
    assert any(n.startswith("TRL 0.13.0 sft trainer: kbit_prep trl") for n in job.notes)
    assert job.flags()[job.flags().index("--kbit-prep") + 1] == "trl"
    plain = job_from_trainer(SimpleNamespace(**vars(args)), model, seq=64)  # not a TRL config: as given
    assert plain.setup.quant is not None and plain.setup.quant.kbit_prep == "none"


def test_sharding_and_optimizer_names_are_read_from_the_arguments() -> None:
    model = _model()
    batch = {"input_ids": torch.zeros(BATCH, SEQ, dtype=torch.long)}
    ds = {
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu"},
            "reduce_bucket_size": 4096,
            "stage3_prefetch_bucket_size": "auto",
        }
    }
    args = SimpleNamespace(per_device_train_batch_size=BATCH, optim="adafactor", bf16=True, world_size=8,
                           deepspeed=ds, gradient_accumulation_steps=4)  # fmt: skip
    job = job_from_trainer(args, model, batch)
    par = job.parallelism
    assert par is not None
    assert (par.gpus, par.zero_stage, par.offload_optimizer.value, par.reduce_bucket_size) == (
        8,
        3,
        "cpu",
        4096,
    )
    # DeepSpeed bf16 keeps bf16 weights and fp32 masters; transformers' Adafactor steps tensor by tensor
    s = job.setup
    assert (s.precision.value, s.optimizer.value, s.optimizer_impl.value, s.grad_accum) == (
        "mixed-bf16", "adafactor", "for-loop", 4)  # fmt: skip
    ds["optimizer"] = {"type": "AdamW", "params": {"lr": "auto"}}  # DeepSpeed's own: args.optim unused
    job = job_from_trainer(args, model, batch)
    assert (job.setup.optimizer.value, job.setup.optimizer_impl.value) == ("adamw", "fused")
    assert job.parallelism is not None and job.parallelism.zero_init and "--no-zero-init" not in job.flags()
    # transformers before 5.0 marks a model built outside ZeRO-3's zero.Init; the CLI gets the same flag
    model._transformers_zero3_init_used = False
    outside = job_from_trainer(args, model, batch)
    assert outside.parallelism is not None and not outside.parallelism.zero_init
    assert "--no-zero-init" in outside.flags()
    # transformers 5.x marks nothing: the callback reads the parameters at on_init_end, before
    # deepspeed.initialize: zero.Init gives each a ds_id, a model built outside it has none
    del model._transformers_zero3_init_used
    cb = PeakmemCallback()
    cb.on_init_end(args, None, None, model=model)
    assert cb._zero_init is False
    plain = job_from_trainer(args, model, batch, zero_init=cb._zero_init)
    assert plain.parallelism is not None and not plain.parallelism.zero_init
    for p in model.parameters():
        p.ds_id = 0  # type: ignore[attr-defined]
    cb.on_init_end(args, None, None, model=model)
    assert cb._zero_init is True
    inside = job_from_trainer(args, model, batch, zero_init=cb._zero_init)
    assert inside.parallelism is not None and inside.parallelism.zero_init
    fsdp = SimpleNamespace(
        per_device_train_batch_size=BATCH,
        optim="sgd",
        optim_args="momentum=0.9",
        world_size=4,
        fsdp=["full_shard", "auto_wrap"],
        fsdp_config={"version": 1},
    )
    job = job_from_trainer(fsdp, model, batch)
    assert job.parallelism is not None
    assert (job.parallelism.fsdp.value, job.parallelism.fsdp_version) == ("full-shard", 1)
    assert (job.setup.precision.value, job.setup.optimizer.value) == ("fp32", "sgd-momentum")
    lomo = SimpleNamespace(per_device_train_batch_size=1, optim="lomo")
    with pytest.raises(InputError, match="optim='lomo': not modelled"):
        job_from_trainer(lomo, model, batch)


def test_a_job_it_cannot_model_runs_unchecked_unless_strict(capsys: Any) -> None:
    args = SimpleNamespace(per_device_train_batch_size=1, optim="lomo", device=torch.device("cpu"))
    state = SimpleNamespace(is_world_process_zero=True, global_step=0, log_history=[])
    control = SimpleNamespace(should_training_stop=False)
    cb = PeakmemCallback(gpu="1MB", seq=SEQ)
    assert cb.on_train_begin(args, state, control, model=_model()) is control
    assert not control.should_training_stop and state.log_history == [] and cb.json is None
    assert "cannot estimate this job, training goes on unchecked: TrainingArguments.optim='lomo'" in (
        capsys.readouterr().err)  # fmt: skip
    with pytest.raises(InputError, match="optim='lomo'"):
        PeakmemCallback(seq=SEQ, strict=True).on_train_begin(args, state, control, model=_model())


def test_the_callback_answers_what_the_cli_answers(tmp_path: Any) -> None:
    """CLI = callback: `peakmem train <the model's config.json> <the job's flags> --gpu 80GB --json`."""
    cb = PeakmemCallback(gpu="80GB", quiet=True)
    _train(_model(), _args(tmp_path, max_steps=1, bf16=True, gradient_accumulation_steps=2), cb)
    assert cb.json is not None
    assert _cli_json(tmp_path, cb) == json.loads(json.dumps(cb.json))


def _cli_json(tmp_path: Any, cb: PeakmemCallback) -> Any:
    """`peakmem train <the model's config.json> <the job's flags> --gpu 80GB --json`, in process."""
    from peakmem.cli import main

    assert cb.job is not None
    folder = tmp_path / "cli" / cb.job.name  # the CLI names a model after its config's folder
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cb.job.config))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["train", str(folder), *cb.job.flags(), "--gpu", "80GB", "--json"])
    assert code == 0
    return json.loads(out.getvalue())


# The one TrainingArguments mapping: transformers' own TrainingArguments(...).to_dict() written to JSON and
# read by `peakmem train --from` gives the setup the callback reads from the live arguments (the file states
# the weights' dtype as torch_dtype where the model is not fp32: a JSON dump cannot see the model).
@pytest.mark.parametrize(
    ("kw", "dtype", "expected"),
    [
        (dict(bf16=True, gradient_accumulation_steps=2, gradient_checkpointing=True), None,
         ("amp-bf16", "adamw", "fused", "full", 2)),
        (dict(optim="adafactor"), None, ("fp32", "adafactor", "for-loop", "none", 1)),
        (dict(optim="lion_32bit", bf16=True), None, ("amp-bf16", "lion", "fused", "none", 1)),
        (dict(optim="paged_adamw_32bit"), None, ("fp32", "paged-adamw", "fused", "none", 1)),
        (dict(optim="paged_lion_8bit"), None, ("fp32", "lion-8bit", "fused", "none", 1)),
        # transformers maps adamw_torch_8bit to torchao.optim.AdamW8bit
        (dict(optim="adamw_torch_8bit"), None, ("fp32", "adamw-8bit-torchao", "fused", "none", 1)),
        (dict(optim="sgd", optim_args="momentum=0.9"), None, ("fp32", "sgd-momentum", "foreach", "none", 1)),
        (dict(optim="adamw_torch", bf16=True), torch.bfloat16, ("bf16", "adamw", "foreach", "none", 1)),
        # fp16 weights, no flag, full fine-tuning: HF Trainer trains them as they are (pure 16-bit bytes)
        (dict(), torch.float16, ("bf16", "adamw", "fused", "none", 1)),
        # transformers 5.23 rewrites the legacy options into fsdp=True + fsdp_config; FSDP2 by default
        (dict(fsdp="full_shard offload", bf16=True), None, ("amp-bf16", "adamw", "fused", "none", 1)),
    ],
    ids=["amp-ckpt-accum", "adafactor", "lion32", "paged32", "paged-lion8", "torchao8", "sgd-m", "bf16-w",
         "fp16-w", "fsdp"],
)  # fmt: skip
def test_the_callback_and_from_file_read_the_same_arguments(
    tmp_path: Any, kw: dict[str, Any], dtype: Any, expected: tuple[Any, ...]
) -> None:
    from peakmem.cli import main

    args = _args(tmp_path, **kw)
    model = _model() if dtype is None else _model().to(dtype)
    cb = PeakmemCallback(gpu="80GB", seq=SEQ, quiet=True)
    state = SimpleNamespace(is_world_process_zero=True, global_step=0, log_history=[])
    cb.on_train_begin(args, state, SimpleNamespace(should_training_stop=False), model=model)
    assert cb.job is not None and cb.json is not None
    s = cb.job.setup
    assert (s.precision.value, s.optimizer.value, s.optimizer_impl.value, s.checkpointing.value,
            s.grad_accum) == expected  # fmt: skip
    doc = args.to_dict()
    if dtype is not None:
        doc["torch_dtype"] = str(dtype).removeprefix("torch.")
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps(doc))
    folder = tmp_path / "cli" / cb.job.name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cb.job.config))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        # processes per node are live only (LOCAL_WORLD_SIZE, else min(gpus, 8)); a file does not say
        per_node = ["--gpus-per-node", "1"] if "fsdp" in kw else []
        code = main(["train", str(folder), "--from", str(path), "--seq", str(SEQ), *per_node, "--gpu", "80GB",
                     "--json"])  # fmt: skip
    assert code == 0
    from_file = json.loads(out.getvalue())
    assert from_file.pop("from_file")["format"] == "transformers/trl"
    assert from_file == json.loads(json.dumps(cb.json))
    if "fsdp" in kw:
        par = cb.job.parallelism
        assert par is not None and (par.fsdp.value, par.fsdp_version, par.offload_params.value) == (
            "full-shard", 2, "cpu")  # fmt: skip


def test_a_file_that_leaves_optim_out_answers_what_the_callback_answers(tmp_path: Any) -> None:
    """transformers 5.23 on torch >= 2.8 defaults optim to adamw_torch_fused: the callback reads it from the
    live arguments, --from a TrainingArguments file without the key takes the same default."""
    from peakmem.cli import main

    args = _args(tmp_path, bf16=True)
    cb = PeakmemCallback(gpu="80GB", seq=SEQ, quiet=True)
    state = SimpleNamespace(is_world_process_zero=True, global_step=0, log_history=[])
    cb.on_train_begin(args, state, SimpleNamespace(should_training_stop=False), model=_model())
    assert cb.job is not None and cb.job.setup.optimizer_impl.value == "fused"
    doc = args.to_dict()
    del doc["optim"]
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps(doc))
    folder = tmp_path / "cli" / cb.job.name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cb.job.config))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert (
            main(["train", str(folder), "--from", str(path), "--seq", str(SEQ), "--gpu", "80GB", "--json"])
            == 0
        )
    from_file = json.loads(out.getvalue())
    block = from_file.pop("from_file")
    assert any(m["field"] == "optimizer-impl" and m["value"] == "fused" for m in block["mapped"]), block
    assert from_file == json.loads(json.dumps(cb.json))


def test_fp16_flag_on_fp16_weights_in_full_fine_tuning_is_an_error() -> None:
    """torch's GradScaler refuses fp16 gradients ("Attempting to unscale FP16 gradients") at step one."""
    args = SimpleNamespace(per_device_train_batch_size=1, fp16=True)
    with pytest.raises(InputError, match="fp16=True on fp16 weights"):
        job_from_trainer(args, _model().to(torch.float16), seq=SEQ)


def test_a_deepspeed_json_file_named_by_the_arguments_is_read(tmp_path: Any) -> None:
    ds = {
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
        "bf16": {"enabled": True},
    }
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    args = SimpleNamespace(
        per_device_train_batch_size=1, bf16=True, world_size=2, deepspeed=str(tmp_path / "ds.json")
    )
    job = job_from_trainer(args, _model(), seq=SEQ)
    assert job.parallelism is not None
    par = job.parallelism
    assert (par.zero_stage, par.offload_optimizer.value, job.setup.precision.value) == (
        2,
        "cpu",
        "mixed-bf16",
    )
    args.deepspeed = str(tmp_path / "missing.json")
    with pytest.raises(InputError, match=r"TrainingArguments\.deepspeed=.*no such file"):
        job_from_trainer(args, _model(), seq=SEQ)
