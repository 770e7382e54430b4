"""``peakmem serve``: a JSON API and one static page, served locally (optional extra: ``peakmem[web]``).

FastAPI and uvicorn are imported only by :mod:`peakmem.web.app`; ``import peakmem.web`` stays light.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


def create_app() -> Any:
    """The FastAPI application (imports FastAPI)."""
    from peakmem.web.app import create_app as _create

    return _create()


def serve(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    open_browser: bool = False,
    allow_hosts: Sequence[str] = (),
) -> None:
    """Run the server until interrupted (imports FastAPI and uvicorn); it answers only requests whose
    Host header names it, or one of ``allow_hosts`` (:mod:`peakmem.web.hosts`)."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        from peakmem.errors import InputError

        raise InputError(
            f"peakmem serve needs FastAPI and uvicorn: pip install 'peakmem[web]' ({error})"
        ) from error
    from peakmem.web.app import serve as _serve

    _serve(host=host, port=port, open_browser=open_browser, allow_hosts=allow_hosts)
