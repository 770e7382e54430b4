"""Fetch a model's ``config.json`` from the Hugging Face Hub (the only module that goes online).

``huggingface_hub`` is imported when a fetch is asked for, never at import, so ``import peakmem``
stays light and works without it (it is the ``hub`` extra). Downloads land in huggingface_hub's
cache (``HF_HOME``), so a second run, or one with ``HF_HUB_OFFLINE=1``, reads the cached file.

Every failure becomes a one-line :class:`~peakmem.errors.PeakmemError` that says what to do:
no network -> pass a local path; gated or private -> provide a token; no such repository ->
:class:`HubNotFoundError`, which :mod:`peakmem.resolve` turns into an unknown-model error with
catalog suggestions.
"""

from __future__ import annotations

from typing import Any

from peakmem.errors import ConfigError, PeakmemError

CONFIG_FILE = "config.json"
TOKEN_HINT = "set HF_TOKEN or run `huggingface-cli login`"
LOCAL_HINT = "pass a local path to its config.json (or a folder holding one) instead"


class HubError(PeakmemError):
    """The Hub could not give us the file (exit 2, like other input problems)."""


class HubUnavailableError(HubError):
    """No network, offline mode, or huggingface_hub missing."""


class HubAccessError(HubError):
    """A gated or private repository and no (or an insufficient) token."""


class HubNotFoundError(HubError):
    """No repository of that id on the Hub (or a private one we may not see)."""

    def __init__(self, repo_id: str) -> None:
        self.repo_id = repo_id
        super().__init__(f"no Hugging Face Hub repository {repo_id!r}")


def fetch_config(repo_id: str, *, revision: str | None = None) -> dict[str, Any]:
    """Download (or read from the cache) ``repo_id``'s config.json and parse it."""
    path = download_config(repo_id, revision=revision)
    from peakmem.hf import load_config

    return load_config(path)


def download_config(repo_id: str, *, revision: str | None = None) -> str:
    """Local path of ``repo_id``'s config.json, fetched through huggingface_hub's cache.

    The cache is tried first (works offline). Otherwise one HEAD request without retries decides
    quickly whether the Hub is reachable and the repository readable; only then is the file
    downloaded (huggingface_hub alone would retry a dead network with backoff for ~25 s).
    """
    hub = _import_hub(repo_id)
    from huggingface_hub import errors as hub_errors

    try:
        return str(hub.hf_hub_download(repo_id, CONFIG_FILE, revision=revision, local_files_only=True))
    except hub_errors.LocalEntryNotFoundError:
        pass  # not cached: ask the Hub
    except hub_errors.HFValidationError as e:
        raise HubNotFoundError(repo_id) from e
    try:
        hub.get_hf_file_metadata(hub.hf_hub_url(repo_id, CONFIG_FILE, revision=revision))
        return str(hub.hf_hub_download(repo_id, CONFIG_FILE, revision=revision))
    except Exception as e:
        raise _translate(e, repo_id, revision) from None


def _import_hub(repo_id: str) -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise HubUnavailableError(
            f"cannot fetch {repo_id!r} from the Hugging Face Hub: huggingface_hub is not installed "
            f"(pip install 'peakmem[hub]'); or {LOCAL_HINT}"
        ) from None
    return huggingface_hub


def _translate(error: Exception, repo_id: str, revision: str | None) -> PeakmemError:
    """The peakmem error for what huggingface_hub raised (most specific class first)."""
    from huggingface_hub import errors as hub_errors

    if isinstance(error, hub_errors.GatedRepoError):
        return HubAccessError(
            f"{repo_id!r} is a gated repository: accept its terms on the Hub, then {TOKEN_HINT}; "
            f"or {LOCAL_HINT}"
        )
    if isinstance(error, (hub_errors.RepositoryNotFoundError, hub_errors.HFValidationError)):
        return HubNotFoundError(repo_id)
    if isinstance(error, hub_errors.RevisionNotFoundError):
        return ConfigError(f"{repo_id!r} has no revision {revision!r} on the Hub")
    if isinstance(error, hub_errors.RemoteEntryNotFoundError):
        return ConfigError(f"{repo_id!r} has no {CONFIG_FILE} on the Hub; {LOCAL_HINT}")
    if isinstance(error, hub_errors.HfHubHTTPError):
        status = getattr(getattr(error, "response", None), "status_code", None)
        if status in (401, 403):
            return HubAccessError(
                f"the Hub refused access to {repo_id!r} (HTTP {status}): {TOKEN_HINT}; or {LOCAL_HINT}"
            )
        return HubUnavailableError(_unreachable(repo_id, f"HTTP {status}"))
    if isinstance(error, hub_errors.OfflineModeIsEnabled):
        return HubUnavailableError(_unreachable(repo_id, "HF_HUB_OFFLINE is set and it is not in the cache"))
    if isinstance(error, hub_errors.LocalEntryNotFoundError):
        return HubUnavailableError(_unreachable(repo_id, "offline or no network, and not in the cache"))
    # Connection errors and timeouts of the HTTP client (httpx), OSError, ...
    return HubUnavailableError(_unreachable(repo_id, f"no connection: {type(error).__name__}"))


def _unreachable(repo_id: str, why: str) -> str:
    return f"could not reach the Hugging Face Hub to fetch {repo_id!r} ({why}); {LOCAL_HINT}"
