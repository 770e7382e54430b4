"""The JSON API behind ``peakmem serve``, and the static page it serves.

Endpoints (schema at ``/openapi.json``, read offline at ``/docs``):

Every answer is :func:`peakmem.question.answer`'s, the function behind the CLI's ``--json`` and the
Python API, so the three say the same for the same question.

- ``POST /api/train``: the CLI's ``peakmem train --json`` object, plus ``headline`` (the one-line
  answer) and ``chart`` (the stacked bars of :func:`peakmem.plot.chart_json`);
- ``POST /api/infer``: the CLI's ``peakmem infer --json`` object, plus ``headline`` and ``chart``;
- ``POST /api/fit``: the CLI's ``peakmem fit --json`` object (the planner's verdicts, ranked changes
  and limits per GPU), plus ``headline`` and ``estimate`` (the ``/api/train`` answer, for the page);
- ``POST /api/fit_infer``: ``peakmem fit --infer --json`` (per GPU: longest context, most sequences,
  ranked changes), plus ``headline`` and ``estimate`` (the ``/api/infer`` answer);
- ``POST /api/plan``: ``peakmem plan --json`` (the fastest layouts that fit, per-rank memory);
- ``GET /api/models``, ``GET /api/gpus``: the catalogs, as ``peakmem models|gpus --json``.

A model is a catalog name (``model``) or a pasted ``config.json`` object (``config``); the server
never reads paths or fetches from the network. Bad input is answered 422 (an unknown model or
GPU 404, with suggestions) with ``{"error": one line, "field": the field, "detail": [...]}``;
a body over :data:`MAX_BODY_BYTES` is answered 413 before it is parsed.
"""

from __future__ import annotations

import re
import threading
import webbrowser
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from peakmem import __version__
from peakmem.errors import PeakmemError, UnknownNameError
from peakmem.question import Answer, Question
from peakmem.units import MiB, fmt_count
from peakmem.web.hosts import HostCheck, allowed_hosts, host_name, send_error
from peakmem.web.schemas import (
    EstimateResponse,
    FitInferRequest,
    FitInferResponse,
    FitRequest,
    FitResponse,
    GpuEntry,
    InferRequest,
    ModelChoice,
    ModelEntry,
    PlanRequest,
    PlanResponse,
    TrainOptions,
    TrainRequest,
)

STATIC_DIR = Path(__file__).with_name("static")

# --- limits: what the API accepts (each far beyond any real job, small enough to answer fast) ------
MAX_BODY_BYTES = 1 * MiB  # a config.json is a few KiB; the largest in the catalog is under 10 KiB
MAX_DRAIN_BYTES = 64 * MiB  # an oversized body is read (and dropped) up to this, so the client sees 413
# A pasted config: no integer above MAX_CONFIG_INT (hidden sizes are < 2**15, vocabularies < 2**19,
# contexts < 2**24), at most MAX_CONFIG_LAYERS layers (the deepest catalog model has 126), and at
# most MAX_PARAMS parameters in all (the largest published models have about 2 T).
MAX_CONFIG_INT = 2**24
MAX_CONFIG_LAYERS = 1024
MAX_PARAMS = 10**13
LAYER_KEYS = frozenset({
    "num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers", "num_encoder_layers",
})  # fmt: skip
# Integers that are not sizes (token ids, seeds, RoPE bases): never bounded.
UNBOUNDED_KEY_PARTS = ("token_id", "theta", "seed", "base")


class ApiError(Exception):
    """An error answered as JSON: status, the field it concerns, one line."""

    def __init__(self, status: int, field: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message
        self.extra = extra


# --- building blocks -------------------------------------------------------------------------------
_FIELD = re.compile(r"^(?:config\.json: )?(?:missing key '([^']+)'|-*([A-Za-z_][\w.\-]*)=)")


def field_of(error: Exception, default: str, prefix: str = "") -> str:
    """The field an error message names (``batch=0: ...`` -> ``batch``), else ``default``."""
    match = _FIELD.match(str(error))
    if not match:
        return default
    return prefix + (match.group(1) or match.group(2)).replace("-", "_")


def check_config_sizes(config: Mapping[str, Any], path: str = "config", depth: int = 0) -> None:
    """Reject absurd sizes in a pasted config before building anything from it."""
    for key, value in config.items():
        where = f"{path}.{key}"
        if isinstance(value, dict) and depth < 3:
            check_config_sizes(value, where, depth + 1)
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if any(part in key for part in UNBOUNDED_KEY_PARTS):
            continue
        limit = MAX_CONFIG_LAYERS if key in LAYER_KEYS else MAX_CONFIG_INT
        if value > limit:
            raise ApiError(422, where, f"{where}={value}: too large; at most {limit:,} is accepted")


def _spec(req: ModelChoice) -> Any:
    from peakmem.catalog import find_model, unknown_model
    from peakmem.resolve import resolve_model

    if req.model is not None:
        if find_model(req.model) is None:  # the server reads no paths and fetches nothing
            raise unknown_model(req.model)
        try:
            return resolve_model(req.model)
        except UnknownNameError:
            raise
        except PeakmemError as error:
            raise ApiError(422, "model", str(error)) from error
    from peakmem.hf import spec_from_config

    assert req.config is not None
    check_config_sizes(req.config)
    raw_name = req.config.get("_name_or_path")
    name = req.name or (raw_name if isinstance(raw_name, str) and raw_name else "pasted config.json")
    try:
        spec = spec_from_config(req.config, name=name)
    except PeakmemError as error:
        raise ApiError(422, field_of(error, "config", "config."), str(error)) from error
    if spec.params > MAX_PARAMS:
        raise ApiError(
            422,
            "config",
            f"config: {fmt_count(spec.params)} parameters; at most {fmt_count(MAX_PARAMS)} accepted",
        )
    return spec


def _config(req: ModelChoice) -> Mapping[str, Any]:
    """The config.json behind the request's model (a catalog entry's, or the pasted one)."""
    if req.config is not None:
        return req.config
    from peakmem.resolve import resolve_config

    assert req.model is not None
    return resolve_config(req.model)[1]


def _gpus(names: list[str]) -> list[Any]:
    from peakmem.resolve import resolve_gpu

    out = []
    for i, name in enumerate(names):
        try:
            out.append(resolve_gpu(name))
        except UnknownNameError:
            raise
        except PeakmemError as error:
            raise ApiError(422, f"gpus.{i}", str(error)) from error
    return out


# A request field is the CLI option of the same name (its argparse dest), but for these.
_CLI_DEST = {"gpu_count": "gpus"}
_API_FIELD = {dest: name for name, dest in _CLI_DEST.items()}
_NOT_CLI = frozenset({"model", "config", "name", "gpus"})  # the model and the GPUs are passed apart


def question_of(command: str, req: ModelChoice) -> Question:
    """The question ``peakmem COMMAND ... --json`` asks for the same request: the request's fields are
    the options of the same names (:mod:`peakmem.options`), what it leaves out their defaults."""
    from peakmem import options
    from peakmem.question import ask

    takes = {o.name for o in options.of(command)}
    given: dict[str, Any] = {}
    for name in type(req).model_fields:
        if name in _NOT_CLI:
            continue
        dest = _CLI_DEST.get(name, name)
        if dest not in takes:  # a field that the command does not take: a bug here
            raise AssertionError(f"peakmem {command} has no option for the request field {name}")
        value = getattr(req, name)
        given[dest] = value.value if isinstance(value, Enum) else value
    given["gpu"] = ",".join(req.gpus) or None
    draft = given.get("draft")
    if isinstance(draft, str) and draft not in ("mtp", "ngram"):
        from peakmem.catalog import find_model, unknown_model

        if find_model(draft) is None:  # a draft is a catalog name too: the server reads no paths
            raise unknown_model(draft)
    if command == "fit":
        given["infer"] = isinstance(req, InferRequest)
    from peakmem.simulate import measuring_lookup

    spec = _spec(req)
    return ask(command, given, spec=spec, costs=measuring_lookup(), config=_config(req))


def cli_answer(command: str, req: ModelChoice) -> Answer:
    """``peakmem COMMAND --json`` for the request: :func:`peakmem.question.answer`, the one function
    the CLI and the Python API answer with (a pasted config is passed as the model it builds)."""
    from peakmem.question import answer

    _gpus(req.gpus)  # each unknown or bad GPU named by its place in the list
    try:
        return answer(question_of(command, req))
    except UnknownNameError:
        raise
    except PeakmemError as error:  # named by the request's field (gpu_count, not the CLI's --gpus)
        field = field_of(error, "body")
        api_field = _API_FIELD.get(field, field)
        raise ApiError(
            422, api_field if api_field in type(req).model_fields else field, str(error)
        ) from error


def train_answer(req: TrainOptions) -> dict[str, Any]:
    """``peakmem train --json`` for the request, plus ``headline`` (the CLI's first line) and ``chart``
    (the bars of :func:`peakmem.plot.chart_json`)."""
    from peakmem.answers import train_headline
    from peakmem.plot import chart_json

    got = cli_answer("train", req)
    q, est = got.question, got.estimate
    assert est is not None and q.training is not None
    out = got.json
    out["headline"] = train_headline(q.spec.name, q.training, est, par=q.parallel)
    out["chart"] = chart_json(est, got.ways.pairs() if got.ways is not None else [])
    return out


def infer_answer(req: InferRequest) -> dict[str, Any]:
    """``peakmem infer --json`` for the request, plus ``headline`` and ``chart``."""
    from peakmem.plot import chart_json

    got = cli_answer("infer", req)
    out = got.json
    out["headline"] = got.served.headline
    out["chart"] = chart_json(got.served.estimate)
    return out


def fit_answer(req: FitRequest) -> dict[str, Any]:
    """``peakmem fit --json`` for the request, plus ``headline`` and ``estimate`` (the ``/api/train``
    answer to the same question, for the page's chart and tables)."""
    out = cli_answer("fit", req).json
    estimate = train_answer(req)
    out["headline"] = estimate["headline"]
    out["estimate"] = estimate
    return out


def fit_infer_answer(req: FitInferRequest) -> dict[str, Any]:
    """``peakmem fit --infer --json`` for the request, plus ``headline`` and ``estimate`` (the
    ``/api/infer`` answer to the same question)."""
    out = cli_answer("fit", req).json
    estimate = infer_answer(req)
    out["headline"] = estimate["headline"]
    out["estimate"] = estimate
    return out


def plan_answer(req: PlanRequest) -> dict[str, Any]:
    """``peakmem plan --json`` for the request."""
    return cli_answer("plan", req).json


@cache
def model_entries() -> list[dict[str, Any]]:
    from peakmem.catalog import MODELS
    from peakmem.hf import spec_from_config

    out = []
    for m in MODELS:
        try:
            params: int | None = spec_from_config(m.config, name=m.name).params
        except PeakmemError:
            params = None
        out.append({"name": m.name, "family": m.family, "hub_id": m.hub_id, "aliases": list(m.aliases),
                    "source": m.source, "params": params})  # fmt: skip
    return out


def gpu_entries() -> list[dict[str, Any]]:
    from peakmem.catalog import GPUS

    return [
        {"name": g.name, "display_name": g.display_name, "vendor": g.vendor, "memory_bytes": g.memory_bytes,
         "usable_bytes": g.usable_bytes, "aliases": list(g.aliases), "bf16_tflops": g.bf16_tflops,
         "bandwidth_gbps": g.bandwidth_gbps, "source": g.memory_source}
        for g in GPUS
    ]  # fmt: skip


# --- errors ----------------------------------------------------------------------------------------
def _error_response(status: int, field: str, message: str, **extra: Any) -> JSONResponse:
    detail = [{"loc": ["body", *field.split(".")], "msg": message, "type": "value_error"}]
    return JSONResponse(
        status_code=status, content={"error": message, "field": field, "detail": detail, **extra}
    )


def _validation_response(error: RequestValidationError) -> JSONResponse:
    detail = []
    for e in error.errors():
        loc = [str(part) for part in e.get("loc", ())]
        detail.append({"loc": loc, "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))})
    first = detail[0] if detail else {"loc": ["body"], "msg": "invalid request"}
    field = ".".join(part for part in first["loc"] if part != "body") or "body"
    message = f"{field}: {first['msg']}"
    return JSONResponse(status_code=422, content={"error": message, "field": field, "detail": detail})


def _peakmem_response(error: PeakmemError, field: str) -> JSONResponse:
    if isinstance(error, UnknownNameError):
        kind_field = "gpus" if error.kind == "gpu" else "model"
        return _error_response(404, kind_field, str(error), suggestions=error.suggestions)
    return _error_response(422, field_of(error, field), str(error))


# --- the body limit --------------------------------------------------------------------------------
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimit:
    """ASGI middleware: the body is read first, up to ``limit`` bytes; a longer one (by its
    Content-Length or as it streams in) is answered 413 and never reaches the application. The
    excess is read and dropped (up to MAX_DRAIN_BYTES) so that the client gets the answer."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._drain(receive, 0)
            await self._reject(send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            more = bool(message.get("more_body", False))
            if size > self.limit:
                if more:
                    await self._drain(receive, size)
                await self._reject(send)
                return
            chunks.append(chunk)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _drain(self, receive: Receive, seen: int) -> None:
        more = True
        while more and seen <= MAX_DRAIN_BYTES:
            message = await receive()
            if message["type"] != "http.request":
                return
            seen += len(message.get("body", b""))
            more = bool(message.get("more_body", False))

    async def _reject(self, send: Send) -> None:
        message = f"request body over {self.limit:,} bytes; a config.json is a few KiB"
        await send_error(send, 413, ["body"], message, "too_large")


# --- the application -------------------------------------------------------------------------------
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


def create_app(*, allowed_hosts: frozenset[str] | None = None, port: int = 0) -> FastAPI:
    """The application; with ``allowed_hosts``, a request whose Host header is not one of them (bare or
    with ``port``) is answered 400 (:mod:`peakmem.web.hosts`; ``serve`` always passes them)."""
    app = FastAPI(
        title="peakmem",
        version=__version__,
        description="How much GPU memory an LLM job takes, where every byte goes, and what makes it fit.",
        docs_url=None,  # FastAPI's docs pages load their scripts from a CDN; /docs is served locally
        redoc_url=None,
    )

    @app.exception_handler(RequestValidationError)
    async def _on_validation(_request: Request, error: RequestValidationError) -> JSONResponse:
        return _validation_response(error)

    @app.exception_handler(ApiError)
    async def _on_api_error(_request: Request, error: ApiError) -> JSONResponse:
        return _error_response(error.status, error.field, error.message, **error.extra)

    @app.exception_handler(PeakmemError)
    async def _on_peakmem_error(_request: Request, error: PeakmemError) -> JSONResponse:
        return _peakmem_response(error, "body")

    @app.post("/api/train", response_model=EstimateResponse, tags=["estimate"])
    def api_train(req: TrainRequest) -> dict[str, Any]:
        """GPU memory to train a model: the CLI's `peakmem train --json`, plus headline and chart."""
        return train_answer(req)

    @app.post("/api/infer", response_model=EstimateResponse, tags=["estimate"])
    def api_infer(req: InferRequest) -> dict[str, Any]:
        """GPU memory to serve a model: the CLI's `peakmem infer --json`, plus headline and chart."""
        return infer_answer(req)

    @app.post("/api/fit", response_model=FitResponse, tags=["estimate"])
    def api_fit(req: FitRequest) -> dict[str, Any]:
        """Per GPU: does it fit, the largest batch and seq that fit, and the changes that make it fit."""
        return fit_answer(req)

    @app.post("/api/fit_infer", response_model=FitInferResponse, tags=["estimate"])
    def api_fit_infer(req: FitInferRequest) -> dict[str, Any]:
        """Serving, per GPU: does it fit, the longest context and most sequences that fit, and the
        changes that make it fit: the CLI's `peakmem fit --infer --json`, plus headline and estimate."""
        return fit_infer_answer(req)

    @app.post("/api/plan", response_model=PlanResponse, tags=["estimate"])
    def api_plan(req: PlanRequest) -> dict[str, Any]:
        """The fastest parallel layouts that fit on up to max_gpus of one GPU: `peakmem plan --json`."""
        return plan_answer(req)

    @app.get("/api/models", response_model=list[ModelEntry], tags=["catalog"])
    def api_models() -> list[dict[str, Any]]:
        """The model catalog (as `peakmem models --json`, with parameter counts)."""
        return model_entries()

    @app.get("/api/gpus", response_model=list[GpuEntry], tags=["catalog"])
    def api_gpus() -> list[dict[str, Any]]:
        """The GPU catalog (as `peakmem gpus --json`)."""
        return gpu_entries()

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Content-Security-Policy": CSP})

    @app.get("/docs", include_in_schema=False)
    def docs() -> FileResponse:
        return FileResponse(STATIC_DIR / "docs.html", headers={"Content-Security-Policy": CSP})

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    if allowed_hosts is not None:
        app.add_middleware(HostCheck, allowed=allowed_hosts, port=port)  # outermost: checked first
    return app


def serve(
    host: str = "127.0.0.1", port: int = 8765, *, open_browser: bool = False, allow_hosts: Sequence[str] = ()
) -> None:
    """Run the API and the page until interrupted; it answers only requests whose Host header names it
    (``allow_hosts``: more names). uvicorn 0.54 has no header-read timeout (its ``timeout_keep_alive``
    starts only after a response); h11 caps a request's headers at 16 KiB."""
    import uvicorn

    url = f"http://{host_name(host)}:{port}/"
    print(f"peakmem {__version__}: serving {url} (API docs: {url}docs); Ctrl-C stops", flush=True)
    if open_browser:
        threading.Timer(1.0, webbrowser.open, args=(url,)).start()
    app = create_app(allowed_hosts=allowed_hosts(host, allow_hosts), port=port)
    uvicorn.run(app, host=host, port=port, log_level="warning")
