"""The fake steps of a family, side by side in processes forked from this one.

:func:`measure_once` runs a step (:func:`peakmem.simulate.derive.step.measure_one`) on the model cut to a
few blocks of each kind, else to a prefix, else whole (:data:`CUTS`: the first cut that runs is remembered
per config); :func:`measure_steps` runs several in forked processes, which share the cut models built here
before the fork (module-level state of :mod:`peakmem.simulate.derive.step`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from peakmem import block_costs, progress
from peakmem.errors import InputError
from peakmem.simulate.derive.step import Steps, attn_of, cut_model, measure_one
from peakmem.simulate.quiet import notes_that_matter, quiet_libraries

# how a model is cut for its measurement (:func:`peakmem.simulate.derive.build.truncate`), tried in this
# order: the first that runs is remembered per config for the process's later shapes
CUTS = ("select", "prefix", "none")
_CUT_THAT_RUNS: dict[str, str] = {}

Task = tuple[Any, frozenset[str] | None]  # a step's TrainingSetup, and the block kinds it keeps (all: None)


def measure_once(config: dict[str, Any], setup: Any, kinds: frozenset[str] | None = None) -> Steps:
    """:func:`~peakmem.simulate.derive.step.measure_one` on the model cut to a few blocks of each kind; cut
    to a prefix if that one does not run (Qwen3.5's blocks index the config's per-layer list by their own
    ``layer_idx``), on the whole model if neither does (a model that reads its depth elsewhere). With
    ``kinds``, on the cut that runs reduced to fewer blocks of the other kinds
    (:func:`~peakmem.simulate.derive.build.truncate`) where that runs too."""
    chash = block_costs.config_hash(config)
    known = _CUT_THAT_RUNS.get(chash)
    if kinds is not None and known is not None:
        try:
            return measure_one(config, setup, cut=known, kinds=kinds)
        except Exception:
            pass
    tries = CUTS[CUTS.index(known) :] if known else CUTS
    for cut in tries[:-1]:
        try:
            out = measure_one(config, setup, cut=cut)
        except Exception:
            continue
        _CUT_THAT_RUNS[chash] = cut
        return out
    out = measure_one(config, setup, cut=tries[-1])
    _CUT_THAT_RUNS[chash] = tries[-1]
    return out


def _workers() -> int:
    """How many fake steps run side by side: one per CPU this process may use, where a process can be
    forked (Linux); one elsewhere."""
    if sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return len(os.sched_getaffinity(0))


def measure_steps(config: dict[str, Any], tasks: list[Task]) -> list[Steps | Exception]:
    """:func:`measure_once` for every task (a step that fails gives its error in its place), side by
    side in processes forked from this one (:func:`_workers`), the longest sequences first: the steps
    are independent and each is single-threaded Python (Qwen3-Next-80B's default family measures 14 of
    2.3-12 s). The cut models are built here first (:func:`~peakmem.simulate.derive.step.cut_model`; the
    first build of a family imports its transformers code, 4 s for Qwen3-Next), which the forked
    processes then share."""
    jobs = min(_workers(), len(tasks))
    if jobs < 2:
        out: list[Steps | Exception] = []
        for task in tasks:
            out.append(_step_or_error(config, task))
            progress.advance(len(out))
        return out
    chash = block_costs.config_hash(config)
    cut = _CUT_THAT_RUNS.get(chash, CUTS[0])
    for attn, kinds in {(attn_of(setup), kinds) for setup, kinds in tasks}:
        with contextlib.suppress(Exception):  # where it does not build, the step says why
            cut_model(config, attn, cut, kinds)
    by_length = sorted(
        range(len(tasks)), key=lambda i: (tasks[i][0].seq_len, tasks[i][0].micro_batch), reverse=True
    )
    done: dict[int, Steps | Exception] = {}
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = {pool.submit(_forked_step, config, tasks[i]): i for i in by_length}
        for future in as_completed(futures):
            i = futures[future]
            err = future.exception()
            if isinstance(err, Exception):
                done[i] = err
            else:
                steps, ran, notes = future.result()
                _CUT_THAT_RUNS.setdefault(chash, ran)
                done[i] = steps
                for text in notes:
                    progress.note(text)
            progress.advance(len(done))
    return [done[i] for i in range(len(tasks))]


def _step_or_error(config: dict[str, Any], task: Task) -> Steps | Exception:
    try:
        with quiet_libraries() as said:
            steps = measure_once(config, *task)
    except Exception as err:
        return err
    for text in notes_that_matter(said):
        progress.note(text)
    return steps


def _forked_step(config: dict[str, Any], task: Task) -> tuple[Steps, str, list[str]]:
    """:func:`measure_once` in a forked process, the cut that ran and the notes its libraries' messages
    make (:func:`~peakmem.simulate.quiet.notes_that_matter`, sent back: the child's own are lost with
    it); an error whose type may not
    unpickle in the parent (a library's exception with arguments of its own) comes back as a
    RuntimeError naming it, its traceback kept as the error's cause (sent along as text)."""
    try:
        with quiet_libraries() as said:
            steps = measure_once(config, *task)
        return steps, _CUT_THAT_RUNS[block_costs.config_hash(config)], notes_that_matter(said)
    except Exception as err:
        if isinstance(err, InputError) or type(err).__module__ == "builtins":
            raise
        raise RuntimeError(f"{type(err).__name__}: {err}") from err
