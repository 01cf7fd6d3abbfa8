"""One line for why a Hugging Face Hub download failed: offline, missing repository, gated or
unauthorized, disk full, or the error itself - never "offline" for everything."""

from __future__ import annotations

import errno


def hub_failure_reason(err: BaseException) -> tuple[str, bool]:
    """``(reason, offline)`` for an exception raised by ``huggingface_hub`` downloads."""
    from huggingface_hub import errors

    if isinstance(err, (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled)):
        return "the Hub is unreachable (offline, or HF_HUB_OFFLINE is set)", True
    if isinstance(err, errors.GatedRepoError):
        return "the repository is gated: accept its terms on the Hub, then hf auth login", False
    if isinstance(err, errors.RepositoryNotFoundError):
        return "no such repository on the Hub (or it is private: log in with hf auth login)", False
    if isinstance(err, errors.RevisionNotFoundError):
        return "no such revision in the repository", False
    if isinstance(err, errors.HfHubHTTPError):
        status = getattr(getattr(err, "response", None), "status_code", None)
        if status in (401, 403):
            return f"not authorized (HTTP {status}): log in with hf auth login", False
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
        return "no space left on the device holding the Hugging Face cache (HF_HOME)", False
    network = type(err).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "requests")
    if isinstance(err, (ConnectionError, TimeoutError)) or (
            network and any(w in type(err).__name__ for w in ("Connect", "Timeout", "Network"))):
        return f"the Hub is unreachable ({type(err).__name__})", True
    text = str(err).strip()
    first = text.splitlines()[0][:200] if text else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__, False
