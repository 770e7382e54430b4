"""A real uvicorn server for the web tests: 127.0.0.1, a free port, a bounded start, stopped on exit."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0


@contextlib.contextmanager
def running_server() -> Iterator[str]:
    """Serve ``peakmem.web.app.create_app()`` in a thread; yields its base URL."""
    import uvicorn

    from peakmem.web.app import create_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(), log_level="warning", lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(STOP_TIMEOUT_S)
        sock.close()
