"""Names of the Hugging Face hub told apart from local paths before any request: a mistyped
folder sent to the hub waits a minute on its retries, with or without a network; and a hub
repository fetched as a folder here, to be read as one."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import getproxies

from huggingface_hub import constants, snapshot_download

from .errors import DataError, first_line

# A repository id: "name" or "owner/name", of letters, digits, "-", "_" and ".".
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")
REACH_SECONDS = 5
# Files a snapshot leaves on the hub: weights that loading them would unpickle or that no
# loader here reads; a training run's state.
UNFETCHED = ["*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.msgpack", "*.h5", "*.onnx", "*.gguf"]
# ``from_pretrained``'s options that say which snapshot to fetch, and where to keep it.
SNAPSHOT_OPTIONS = ("revision", "token", "cache_dir", "force_download")


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


def hub_snapshot(name: str, what: str, options: dict) -> Path:
    """The folder in the hub's cache holding repository ``name``'s files (a ``what``), fetched
    unless the hub cannot be asked (then the cached ones, as ``HF_HUB_OFFLINE`` asks); the
    options of ``SNAPSHOT_OPTIONS`` and ``local_files_only`` are taken out of ``options``."""
    given = {key: options.pop(key) for key in SNAPSHOT_OPTIONS if key in options}
    cached_only = bool(options.pop("local_files_only", False))
    unreachable = None if cached_only else hub_unreachable(constants.ENDPOINT)
    try:
        return Path(snapshot_download(name, **given, local_files_only=cached_only or unreachable is not None,
                                      ignore_patterns=UNFETCHED))
    except Exception as error:  # the hub client fails in many types
        why = f"; {unreachable}" if unreachable else ""
        raise DataError(f"{name}: not a folder here, and no {what} from the Hub ({first_line(error)}){why}") from None
