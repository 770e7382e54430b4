"""``peakmem explain SNAPSHOT``: replay of snapshots built to PyTorch's documented structure
(tests/_snapshots.py derives the numbers by hand), attribution by stack frames, the OOM case.

torch's CPU build cannot make a real snapshot (``torch.cuda.memory._snapshot`` needs CUDA), so the
snapshots here are synthetic; tests/test_gpu_fixtures.py reads real ones when a GPU made them.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import _snapshots as S
from peakmem.cli import main
from peakmem.errors import InputError
from peakmem.measure.snapshot import (
    ACTIVATIONS,
    GRADIENTS,
    OPTIMIZER,
    OTHER,
    PARAMETERS,
    TEMPORARIES,
    Frame,
    classify,
    comparison_rows,
    load_snapshot,
    parse_snapshot,
    replay,
)
from peakmem.units import MiB


def frames(raw: list[dict[str, object]]) -> tuple[Frame, ...]:
    return tuple(Frame(str(f["filename"]), int(f["line"]), str(f["name"])) for f in raw)  # type: ignore[call-overload]


def test_classify_by_frames() -> None:
    assert classify(frames(S.PARAM)) == PARAMETERS
    assert classify(frames(S.STATE)) == OPTIMIZER
    assert classify(frames(S.OPT_TMP)) == TEMPORARIES  # adamw's foreach step, not _init_group
    assert classify(frames(S.FORWARD)) == ACTIVATIONS
    assert classify(frames(S.GRAD)) == GRADIENTS  # Python-only stack in backward
    assert classify(frames(S.BWD_TMP)) == TEMPORARIES  # C++ frames, no AccumulateGrad
    acc = [S.f("??", "torch::autograd::AccumulateGrad::apply(...)", 0), *S.BWD_TMP]
    assert classify(frames(acc)) == GRADIENTS
    ckpt = [S.f(f"{S.SITE}/torch/utils/checkpoint.py", "recompute_fn"), *S.GRAD]
    assert classify(frames(ckpt)) == ACTIVATIONS  # recomputed forward inside backward
    assert classify(()) == OTHER
    assert classify(frames([S.TRAIN])) == OTHER


def test_replay_finds_the_hand_derived_peak() -> None:
    rep = replay(S.snapshot())
    assert rep.source == "trace" and not rep.truncated
    assert rep.peak_allocated_bytes == S.PEAK == 195 * MiB
    assert rep.by_category() == S.BY_CATEGORY
    assert rep.peak_reserved_bytes == rep.reserved_at_peak_bytes == S.SEGMENT
    assert rep.peak_event == 8  # segment, param, state, act, fwd_tmp, its two frees, grad, bwd_tmp
    assert rep.live[0].size == 80 * MiB and rep.live[0].category == OPTIMIZER


def test_replay_truncated_trace_counts_earlier_blocks_as_live() -> None:
    events = S.trace()
    # the ring buffer lost the first four events: the segment, the parameters, the states, the activations
    rep = replay(S.snapshot(events[4:]))
    assert rep.truncated  # the activations' free has no alloc in the trace
    assert rep.peak_allocated_bytes == S.PEAK
    cats = rep.by_category()
    assert cats[PARAMETERS] == 40 * MiB and cats[OPTIMIZER] == 80 * MiB  # from the snapshot's blocks
    assert cats[OTHER] == 30 * MiB and cats[ACTIVATIONS] == 0  # freed in the trace: no stack known
    assert any("truncated" in n for n in rep.notes)


def test_replay_without_trace_uses_the_blocks_at_snapshot_time() -> None:
    rep = replay(S.snapshot([]))
    assert rep.source == "segments" and rep.peak_allocated_bytes == S.LIVE_AT_END
    assert rep.by_category()[GRADIENTS] == 40 * MiB
    assert any("no allocation trace" in n for n in rep.notes)


def test_comparison_rows_largest_difference_first() -> None:
    rows = comparison_rows({"parameters": 10, "activations": 100}, {"parameters": 50, "activations": 90})
    assert [r["category"] for r in rows[:2]] == ["parameters", "activations"]
    assert rows[0]["difference_bytes"] == 40 and rows[1]["difference_bytes"] == -10


def test_loading_a_snapshot_needs_no_torch(tmp_path: Path) -> None:
    path = S.write(tmp_path / "s.pickle", S.snapshot())
    code = (
        "import sys; from pathlib import Path; from peakmem.measure.snapshot import load_snapshot, replay; "
        f"r = replay(load_snapshot(Path({str(path)!r})))\n"
        "print(r.peak_allocated_bytes, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(S.PEAK), "False"]


class Evil:  # a pickle that names a class: refused, never constructed
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("pwned",))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (pickle.dumps(Evil()), "names the Python object builtins.print"),
        (b"not a pickle at all", "not a pickle"),
        (pickle.dumps({"hello": 1}), "no 'segments' list"),
        (pickle.dumps({"segments": [{"address": 1}]}), "no total_size"),
        (pickle.dumps({"segments": [], "device_traces": {}}), "device_traces"),
    ],
)
def test_foreign_files_are_named(data: bytes, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_snapshot(data, "x.pickle")


def test_cli_errors_exit_2_without_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.pickle"
    bad.write_text("{}")
    assert main(["explain", str(bad)]) == 2
    assert main(["explain", str(tmp_path / "missing.pickle")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "no such file" in err and "not a pickle" in err


def test_cli_explain_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = S.write(tmp_path / "step.pickle", S.snapshot())
    assert main(["explain", str(path), "--model", "gpt2", "--seq", "128", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["peak_allocated_bytes"] == S.PEAK and out["measured"] == S.BY_CATEGORY
    diffs = [abs(r["difference_bytes"]) for r in out["rows"]]
    assert diffs == sorted(diffs, reverse=True)  # largest difference first
    assert out["predicted"]["parameters"] > 0 and out["prediction"]["model"] == "gpt2"
    assert out["oom"] is None
    assert main(["explain", str(path), "--model", "gpt2", "--seq", "128"]) == 0
    text = capsys.readouterr().out
    assert "predicts" in text and "optimizer_states" in text and "largest blocks" in text


def test_cli_explain_oom_names_the_failed_allocation_and_ways(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = S.write(tmp_path / "oom.pickle", S.oom_snapshot(request=6 * 2**30, device_free=100 * MiB))
    rep = replay(load_snapshot(path))
    assert rep.oom is not None and rep.oom.size == 6 * 2**30 and rep.oom.device_free == 100 * MiB
    assert rep.oom.reserved_bytes == S.SEGMENT and rep.oom.allocated_bytes == S.LIVE_AT_END
    # gpt2-xl full fine-tuning does not fit 24 GB: the ways that fit it are listed, smallest first
    code = main(["explain", str(path), "--model", "gpt2-xl", "--seq", "512", "--gpu", "24GB", "--json"])
    assert code == 0
    oom = json.loads(capsys.readouterr().out)["oom"]
    assert oom["requested_bytes"] == 6 * 2**30 and "modeling_gpt2.py:300 forward" in oom["frame"]
    assert oom["capacity_bytes"] is not None and oom["ways"]
    needs = [w["device_total_bytes"] for w in oom["ways"]]
    assert needs == sorted(needs) and max(needs) <= oom["capacity_bytes"]
    # without --gpu the capacity is what the device held: reserved + free + the CUDA context (512 MiB)
    assert main(["explain", str(path), "--model", "gpt2-xl", "--json"]) == 0
    oom = json.loads(capsys.readouterr().out)["oom"]
    assert oom["capacity_bytes"] == S.SEGMENT + 100 * MiB + 512 * MiB
    # without a model: what failed, and how to get the changes
    assert main(["explain", str(path)]) == 0
    text = capsys.readouterr().out
    assert "out of memory: 6.00 GiB requested" in text and "--model" in text


def test_python_only_backward_blocks_freed_in_backward_are_temporaries() -> None:
    # Two blocks from the same Python-only backward stack: one freed while backward still runs (an
    # activation gradient in flight), one freed by zero_grad (a .grad). Both live at the peak.
    zero_grad = [S.f(f"{S.SITE}/torch/optim/optimizer.py", "zero_grad"), S.TRAIN]
    a, b = S.BASE, S.BASE + 8 * MiB

    def ev(action: str, addr: int, size: int, frames: list[dict[str, object]]) -> dict[str, object]:
        return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames}

    events = [
        ev("segment_alloc", S.BASE, 20 * MiB, S.GRAD),
        ev("alloc", a, 8 * MiB, S.GRAD),
        ev("alloc", b, 4 * MiB, S.GRAD),
        ev("free_requested", b, 4 * MiB, S.GRAD),
        ev("free_completed", b, 4 * MiB, S.GRAD),
        ev("free_requested", a, 8 * MiB, zero_grad),
        ev("free_completed", a, 8 * MiB, zero_grad),
    ]
    snap = {"segments": [{"device": 0, "address": S.BASE, "total_size": 20 * MiB, "blocks": []}],
            "device_traces": [events]}  # fmt: skip
    rep = replay(snap)
    assert rep.peak_allocated_bytes == 12 * MiB and rep.peak_event == 2
    assert rep.by_category()[GRADIENTS] == 8 * MiB and rep.by_category()[TEMPORARIES] == 4 * MiB


AXOLOTL_LORA = Path(__file__).parent / "fixtures" / "frameworks" / "axolotl" / "lora-8b.yml"


def test_cli_explain_from_predicts_what_train_from_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """explain --from reads the job as train --from does (one question, peakmem.question.ask): the same
    model, setup and peak; a flag typed beside the file wins over it (the file names a Hub id: the model is
    typed, which wins as well)."""
    path = S.write(tmp_path / "step.pickle", S.snapshot())
    assert main(["train", "llama-3.1-8b", "--from", str(AXOLOTL_LORA), "--json"]) == 0
    train = json.loads(capsys.readouterr().out)
    assert main(["explain", str(path), "--model", "llama-3.1-8b", "--from", str(AXOLOTL_LORA), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["prediction"]
    assert got["model"] == train["model"]["name"] and got["setup"] == train["setup"]
    assert got["peak_allocated_bytes"] == train["peak_allocated_bytes"]
    assert (
        main(
            [
                "explain",
                str(path),
                "--model",
                "llama-3.1-8b",
                "--from",
                str(AXOLOTL_LORA),
                "--seq",
                "256",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["prediction"]["setup"]["seq_len"] == 256
    assert main(["explain", str(path), "--model", "llama-3.1-8b", "--from", str(AXOLOTL_LORA)]) == 0
    assert "predicts" in capsys.readouterr().out


def test_cli_explain_from_a_post_training_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_fromfile_post_training import GRPO

    cfg = tmp_path / "grpo.yaml"
    cfg.write_text(json.dumps(GRPO))
    path = S.write(tmp_path / "step.pickle", S.snapshot())
    assert main(["explain", str(path), "--from", str(cfg), "--model", "gpt2"]) == 2
    err = capsys.readouterr().err
    assert "objective=grpo" in err and "Traceback" not in err
