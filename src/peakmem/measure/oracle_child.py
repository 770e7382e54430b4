"""One oracle rank in a child process: the parallel oracles (peakmem.measure.parallel, parallel_fsdp1)
fork each rank from their forkserver (a fake process-group world per process) and read its answer back."""

from __future__ import annotations

from typing import Any

CHILD_TIMEOUT_S = 300  # one tiny rank takes about a second


def run_in_child(ctx: Any, measure: Any, args: tuple[Any, ...], what: str) -> Any:
    """``measure(*args)`` in a child of the multiprocessing context ``ctx``: its result, or a
    RuntimeError naming ``what`` with the child's error, or its silence after CHILD_TIMEOUT_S."""
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(send, measure, *args), daemon=True)
    child.start()
    send.close()
    try:
        if receive.poll(CHILD_TIMEOUT_S):
            ok, payload = receive.recv()
        else:
            ok, payload = False, f"no answer in {CHILD_TIMEOUT_S} s"
    except EOFError:
        ok, payload = False, f"the child process died (exit code {child.exitcode})"
    finally:
        if child.is_alive():
            child.kill()
        child.join()
    if not ok:
        raise RuntimeError(f"{what}: {payload}")
    return payload


def _child(send: Any, measure: Any, *args: Any) -> None:
    try:
        send.send((True, measure(*args)))
    except BaseException as err:  # report anything to the parent, which raises it
        import traceback

        send.send((False, f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=-3)}"))
    finally:
        send.close()


__all__ = ["CHILD_TIMEOUT_S", "run_in_child"]
