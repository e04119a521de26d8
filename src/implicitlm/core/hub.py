"""Names of the Hugging Face hub told apart from local paths before any request: a mistyped
folder sent to the hub waits a minute on its retries, with or without a network."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import getproxies

from .errors import DataError

# A repository id: "name" or "owner/name", of letters, digits, "-", "_" and ".".
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")
REACH_SECONDS = 5


def check_local_or_hub(name: str | os.PathLike, what: str) -> None:
    """A folder that exists, or a text that can be a hub name, for ``what`` ("tokenizer");
    else one line, no request."""
    text = os.fspath(name)
    path = Path(text)
    if text and path.is_dir():
        return
    if path.exists() and text:
        raise DataError(f"{name}: expected a {what} folder or hub name, got a file")
    if not HUB_NAME.fullmatch(text) or ".." in text or text.endswith("."):
        raise DataError(f"{name}: no such {what} folder, and not a hub name (owner/name)")


def hub_unreachable(endpoint: str) -> str | None:
    """Why the hub at ``endpoint`` cannot be asked (offline by setting, or no connection
    within seconds); None when it can."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    # Behind a proxy the hub is reached through it: the proxy is what must answer.
    address = urlparse(getproxies().get(urlparse(endpoint).scheme) or endpoint)
    port = address.port or (443 if address.scheme == "https" else 80)
    try:
        with socket.create_connection((address.hostname, port), timeout=REACH_SECONDS):
            return None
    except OSError as error:
        return f"{address.hostname} cannot be reached ({error.strerror or type(error).__name__})"
