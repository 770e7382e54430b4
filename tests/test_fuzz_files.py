"""Hostile files never escape as a traceback, a hang or a memory blow-up (issue 32).

Every command that reads a file the user names (``train --from``, ``fit --from``, ``explain``,
``calibrate``, ``train CONFIG``, ``info CONFIG``, ``--profile`` and ``calibrate --list`` with a
hostile profiles folder) is given every kind of hostile file: a FIFO, ``/dev/zero``, a folder, a
socket, an oversized file, gzip bombs, a YAML alias bomb and cycle, pickle memo-reference bombs,
deep nesting, a truncated file and non-UTF-8 bytes. Each case runs ``python -m peakmem`` in a
subprocess limited to 10 s and 1 GiB of address space (:func:`test_fuzz.run_cli`), and must exit 2
(3 for an unknown name) with one line on stderr and no traceback. The pure parsers are also timed
in-process. ``peakmem`` output into a closed pipe or a full disk ends quietly.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import _snapshots as S
from peakmem.errors import InputError
from peakmem.measure.snapshot import parse_snapshot, replay
from peakmem.userfiles import CappedStream, parse_yaml, read_user_file
from test_fuzz import TIME_LIMIT_S, assert_one_line_error, run_cli

CASE_MEMORY_BYTES = 2**30  # the issue: no case over 1 GB
BOMB_MEMBER = 64 * 2**20  # one gzip member of zeros; members concatenate (RFC 1952 2.2)
BOMB_MEMBERS = 70  # 70 x 64 MiB ~ 4.7 GB inflated from ~4.5 MB, past MAX_SNAPSHOT_BYTES
# The valid-pickle bomb is unpickled up to the gzip ratio cap (~32x its size), so its cost grows with
# it: 20 members (1.3 GB inflated from 1.3 MB) still pass the cap, in ~1 s instead of ~2 s.
STACK_BOMB_MEMBERS = 20
# "Billion laughs" in 324 bytes: 9 anchors, each a list of 9 aliases of the one before: ~9^9 values.
BILLION_LAUGHS = "a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n" + "".join(
    f"{n}: &{n} [{','.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)


# --- the hostile files -------------------------------------------------------------------------------
def gzip_members(first: bytes, filler: bytes, members: int) -> bytes:
    """``first`` then ``members`` copies of ``filler`` as concatenated gzip members (fast to build)."""
    return gzip.compress(first, 1) + gzip.compress(filler, 9) * members


def memo_bomb(events: int = 18_000, stack: int = 130_000) -> bytes:
    """~650 KB: ``events`` distinct alloc events that all name one stack of ``stack`` references to one
    frame (pickle memo references). Walking every event's stack is events x stack ~ 2e9 frames."""
    frame = {"filename": "/x/train.py", "line": 1, "name": "step"}
    frames = [frame] * stack
    trace = [{"action": "alloc", "addr": i, "size": 1, "frames": frames} for i in range(events)]
    return pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4)


def record_bomb(copies: int = 300_000) -> bytes:
    """One segment listed ``copies`` times, each holding one block listed ``copies`` times."""
    block = {"address": 0, "size": 1, "state": "active_allocated", "frames": []}
    seg = {"device": 0, "address": 0, "total_size": 1, "blocks": [block] * 2}
    return pickle.dumps({"segments": [seg] * copies, "device_traces": []}, protocol=4)


def hostile_files(tmp: Path) -> dict[str, str]:
    """Every kind of hostile file, by name; ``profiles`` is a config folder whose profiles are hostile."""
    files: dict[str, str] = {"zero": "/dev/zero"}

    def put(name: str, data: bytes | str) -> None:
        path = tmp / name
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        files[name] = str(path)

    for name in ("fifo.yaml", "fifo.json", "fifo.pickle"):
        os.mkfifo(tmp / name)
        files[name] = str(tmp / name)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp / "sock.json"))
    files["sock.json"] = str(tmp / "sock.json")
    for name in ("folder.json", "folder.pickle"):
        (tmp / name).mkdir()
        files[name] = str(tmp / name)
    fifo_model = tmp / "fifo-model"
    fifo_model.mkdir()
    os.mkfifo(fifo_model / "config.json")
    files["fifo-model"] = str(fifo_model)
    put("big.yaml", "# padding\n" * 120_000)  # 1.2 MB: past --from's 1 MiB
    for name, size in (("sparse.json", 60 * 10**6), ("sparse.pickle", 4 * 10**9 + 1)):
        with (tmp / name).open("wb") as fh:  # a hole: st_size without the disk
            fh.truncate(size)
        files[name] = str(tmp / name)
    put("laughs.yaml", BILLION_LAUGHS)
    # the same bomb where an HF Trainer config keeps its LoRA targets: unbounded, it ran for over a minute
    lora = BILLION_LAUGHS.replace("i: &i", "lora_target_modules: &i")
    put("laughs-lora.yaml", lora + "model_name_or_path: gpt2\nuse_peft: true\n")
    put("cycle.yaml", "a: &a [1, *a]\nmodel_name_or_path: gpt2\n")
    put("deep.yaml", "[" * 100_000)
    put("deep.json", "[" * 100_000 + "]" * 100_000)
    put("deep-obj.json", '{"a":' * 100_000 + "1" + "}" * 100_000)
    put("truncated.yaml", "model_name_or_path: gpt2\nper_device_train_batch_size: [1,")
    put("truncated.json", '{"peak_allocated_bytes": 1')
    put("latin1.yaml", b"model_name_or_path: caf\xe9\n")
    put("latin1.json", b'{"peak_allocated_bytes": "\xff\xfe"}')
    put("latin1-config.json", b'{"model_type": "gpt2", "n_layer": "\xff"}')
    put("zeros.pickle.gz", gzip_members(b"", bytes(BOMB_MEMBER), BOMB_MEMBERS))
    # a valid pickle start whose one object claims 4 GiB (BINBYTES8), then the zeros to fill it
    put("length.pickle.gz", gzip_members(b"\x80\x04\x8e" + (2**32).to_bytes(8, "little"),
                                         bytes(BOMB_MEMBER), BOMB_MEMBERS))  # fmt: skip
    # MARK, then one small int after another: a valid pickle that only grows the unpickler's stack
    put("stack.pickle.gz", gzip_members(b"\x80\x04(", b"K\x00" * (BOMB_MEMBER // 2), STACK_BOMB_MEMBERS))
    put("memo.pickle", memo_bomb())
    put("records.pickle", record_bomb())
    put("deep.pickle", b"\x80\x02" + b"]" * 100_000 + b"a" * 99_999 + b".")
    whole = pickle.dumps(S.snapshot())
    put("truncated.pickle", whole[: len(whole) // 2])
    put("truncated.pickle.gz", gzip.compress(whole)[:200])
    put("latin1.pickle", b"\x80\xff\xfe not a pickle")
    put("measure.json", '{"peak_allocated_bytes": 1000000000, "peak_reserved_bytes": 1200000000}')
    profiles = tmp / "config" / "profiles"
    profiles.mkdir(parents=True)
    os.mkfifo(profiles / "fifo.json")
    (profiles / "folder.json").mkdir()
    (profiles / "deep.json").write_text("[" * 100_000)
    (profiles / "latin1.json").write_bytes(b"\xff\xfe")
    (profiles / "zero.json").symlink_to("/dev/zero")
    files["profiles"] = str(tmp / "config")
    return files


FROM = [
    "fifo.yaml", "fifo.json", "zero", "folder.json", "sock.json", "big.yaml", "laughs.yaml",
    "laughs-lora.yaml", "cycle.yaml", "deep.yaml", "deep.json", "deep-obj.json", "truncated.yaml",
    "latin1.yaml",
]  # fmt: skip
SNAPSHOTS = [
    "fifo.pickle", "zero", "folder.pickle", "sock.json", "sparse.pickle", "zeros.pickle.gz",
    "length.pickle.gz", "stack.pickle.gz", "memo.pickle", "records.pickle", "deep.pickle",
    "truncated.pickle", "truncated.pickle.gz", "latin1.pickle",
]  # fmt: skip
CALIBRATE = [
    "fifo.json", "fifo.pickle", "zero", "folder.json", "sock.json", "sparse.json", "deep.json",
    "truncated.json", "latin1.json", "memo.pickle", "zeros.pickle.gz",
]  # fmt: skip
CONFIGS = ["fifo.json", "fifo-model", "zero", "sock.json", "sparse.json", "latin1-config.json", "deep.json"]
PROFILES = ["fifo", "folder", "deep", "latin1", "zero"]

CASES: list[tuple[str, str]] = [
    *((f"train-from-{f}", f"train --from {{{f}}}") for f in FROM),
    *((f"fit-from-{f}", f"fit --from {{{f}}} --gpu 24GB") for f in ("fifo.yaml", "zero", "laughs.yaml")),
    *((f"explain-{f}", f"explain {{{f}}}") for f in SNAPSHOTS),
    *((f"calibrate-{f}", f"calibrate {{{f}}} --name t") for f in CALIBRATE),
    ("calibrate-smi-fifo", "calibrate {measure.json} --name t --nvidia-smi-used {fifo.json}"),
    *((f"train-config-{f}", f"train {{{f}}}") for f in CONFIGS),
    *((f"info-config-{f}", f"info {{{f}}}") for f in ("fifo.json", "zero", "latin1-config.json")),
    *((f"profile-{p}", f"train gpt2 --profile {p}") for p in PROFILES),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return hostile_files(tmp_path_factory.mktemp("hostile"))


def test_every_kind_and_command_is_covered() -> None:
    commands = {name.split("-")[0] + ("-from" if "-from-" in name else "") for name, _ in CASES}
    assert {"train-from", "fit-from", "explain", "calibrate", "train", "info", "profile"} <= commands
    assert len({name for name, _ in CASES}) == len(CASES) >= 50


def _args(command: str, files: dict[str, str]) -> list[str]:
    """``command``'s words with each ``{name}`` replaced by that file's path."""
    return [files[w[1:-1]] if w.startswith("{") and w.endswith("}") else w for w in command.split()]


@pytest.mark.parametrize(("name", "command"), CASES, ids=[name for name, _ in CASES])
def test_hostile_file(name: str, command: str, files: dict[str, str], tmp_path: Path) -> None:
    out, took = run_cli(_args(command, files), cwd=tmp_path, env={"PEAKMEM_CONFIG_DIR": files["profiles"]},
                        address_space=CASE_MEMORY_BYTES)  # fmt: skip
    line = assert_one_line_error(out)
    assert "MemoryError" not in line, line
    assert took < TIME_LIMIT_S


def test_calibrate_list_skips_a_hostile_profiles_folder(files: dict[str, str], tmp_path: Path) -> None:
    out, took = run_cli(["calibrate", "--list"], cwd=tmp_path, env={"PEAKMEM_CONFIG_DIR": files["profiles"]},
                        address_space=CASE_MEMORY_BYTES)  # fmt: skip
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert took < TIME_LIMIT_S


# --- in-process: the parsers' bounds and their cost -----------------------------------------------------
def _timed(fn: Any, *args: object, **kwargs: object) -> tuple[str, float]:
    start = time.monotonic()
    with pytest.raises(InputError) as info:
        fn(*args, **kwargs)
    return str(info.value), time.monotonic() - start


def test_billion_laughs_is_refused_fast() -> None:
    assert len(BILLION_LAUGHS.encode()) < 400
    message, took = _timed(parse_yaml, BILLION_LAUGHS, "--from x.yaml")
    assert took < 0.5 and "--from x.yaml: its YAML aliases expand to 490,329,064 values" in message


def test_a_few_aliases_are_read() -> None:
    text = "base: &b {lr: 1.0e-4, epochs: 3}\nrun: *b\nother: {<<: *b, epochs: 4}\n"
    base = {"lr": 1e-4, "epochs": 3}
    assert parse_yaml(text, "x") == {"base": base, "run": base, "other": {**base, "epochs": 4}}


# Bounded time, not speed: each takes under 0.5 s alone on this 2-core machine, a per-event copy of the
# shared stack (1.8e8 frames) takes minutes; the bound leaves room for a CI machine under load.
BOMB_BUDGET_S = 10.0


def test_pickle_memo_bombs_are_refused_fast() -> None:
    for data, where, message in (
        (memo_bomb(), "memo.pickle", "memo.pickle: a trace event's stack has 130,000 frames"),
        (record_bomb(), "records.pickle", "records.pickle: one block record is listed more than once"),
    ):
        assert len(data) < 700_000
        got, took = _timed(parse_snapshot, data, where)
        assert took < BOMB_BUDGET_S and message in got, got


def test_a_stack_shared_by_every_event_costs_its_length_once() -> None:
    """18,000 events naming one stack of 10,000 frames: 1.8e8 frames if each event read its own."""
    start = time.monotonic()
    rep = replay(parse_snapshot(memo_bomb(stack=10_000), "memo.pickle"))
    assert time.monotonic() - start < BOMB_BUDGET_S and rep.peak_allocated_bytes == 18_000


def test_shared_stacks_give_the_same_answer_as_copies() -> None:
    shared = S.snapshot()
    copied = pickle.loads(pickle.dumps(shared))  # the same data, stacks shared by the memo
    assert replay(copied) == replay(shared)


def test_gzip_inflates_only_what_the_unpickler_asks() -> None:
    whole = pickle.dumps(S.snapshot())
    assert parse_snapshot(gzip.compress(whole), "s.gz") == pickle.loads(whole)
    capped = CappedStream(io.BytesIO(b"x" * 100), name="f", what="a thing", max_bytes=10, max_request=8)
    assert capped.read(8) == b"x" * 8
    with pytest.raises(InputError, match="f: asks for one object of 9 bytes"):
        capped.read(9)
    with pytest.raises(InputError, match="f: unpacks to more than 10 bytes"):
        capped.read(4)


def test_a_growing_file_is_cut_at_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(b"x" * 11)
    with pytest.raises(InputError, match="11 bytes is too large"):
        read_user_file(path, what="a thing", max_bytes=10)
    message, took = _timed(read_user_file, Path("/dev/zero"), what="a thing", max_bytes=10)
    assert "a character device, not a thing" in message and took < 1.0


# --- broken pipes and full disks ---------------------------------------------------------------------
@pytest.mark.parametrize("args", [["train", "gpt2", "--json"], ["train", "gpt2", "--emit", "deepspeed"]])
def test_a_closed_pipe_ends_quietly_with_141(args: list[str], tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader left before the first byte: `| head -c 0`
    try:
        out = subprocess.run(
            [*_python_m_peakmem(), *args], stdout=write_end, stderr=subprocess.PIPE, text=True,
            timeout=TIME_LIMIT_S, env=_env(), cwd=tmp_path, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert out.returncode == 141 and out.stderr == "", (out.returncode, out.stderr[-2000:])


@pytest.mark.parametrize("args", [["train", "gpt2", "--json"], ["train", "gpt2", "--emit", "deepspeed"]])
def test_a_full_disk_is_one_line(args: list[str], tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        out = subprocess.run(
            [*_python_m_peakmem(), *args], stdout=full, stderr=subprocess.PIPE, text=True,
            timeout=TIME_LIMIT_S, env=_env(), cwd=tmp_path, check=False,
        )  # fmt: skip
    assert out.returncode == 2 and out.stderr.strip() == "peakmem: error: No space left on device", out.stderr


def _python_m_peakmem() -> list[str]:
    import sys

    return [sys.executable, "-m", "peakmem"]


def _env() -> dict[str, str]:
    from test_fuzz import ROOT

    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(ROOT / "src"),
            "HF_HUB_OFFLINE": "1"}  # fmt: skip
