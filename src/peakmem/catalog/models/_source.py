"""Where a catalog entry's config comes from: the Hub URL of a repository's config.json."""

from __future__ import annotations

_HUB = "https://huggingface.co/"


def _src(hub_id: str) -> str:
    """The Hub URL of a repository's config.json."""
    return f"{_HUB}{hub_id}/blob/main/config.json"
