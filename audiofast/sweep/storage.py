"""Where a study lives: SQLite beside the report by default, or any SQLAlchemy URL
(``postgresql://user@host:5432/db``) that workers on several machines share.

Every storage is Optuna's RDB storage with heartbeats: a worker that dies mid-trial (SIGKILL,
power loss) stops beating, and the next worker to start a trial after the grace period marks
that trial failed and queues its parameters again, so no work is silently lost and the dead
trial is never counted as finished. An unreachable or unusable URL is one line naming it,
raised before any trial runs.
"""

from __future__ import annotations

import re
import time
import warnings
from pathlib import Path


def default_url(run_dir: Path) -> str:
    return f"sqlite:///{(run_dir / 'study.db').resolve()}"


def redact(url: str) -> str:
    """``url`` without its password (for messages and reports)."""
    return re.sub(r"(//[^:/@]+:)[^@]*@", r"\1***@", url)


def open_storage(url: str, heartbeat_interval: int = 10, grace_period: int = 60,
                 max_retry: int | None = 3):
    """Optuna's RDB storage for ``url`` with heartbeats and retries of stale trials, or a
    :class:`SweepConfigError` naming the URL when it cannot be reached or used."""
    import optuna
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

    from audiofast.sweep.params import SweepConfigError

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    kwargs: dict = {}
    if url.startswith("sqlite:"):
        path = url.split(":///", 1)[-1]
        if path and path != ":memory:":
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise SweepConfigError(f"storage {url}: cannot create its folder: "
                                       f"{exc.strerror or exc}") from None
        kwargs = {"connect_args": {"timeout": 60}}  # several local workers share the file
    elif url.startswith("postgresql"):
        kwargs = {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}
    for attempt in range(3):
        try:
            with warnings.catch_warnings():  # heartbeats and retries are "experimental"
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(
                    url, engine_kwargs=kwargs, heartbeat_interval=heartbeat_interval,
                    grace_period=grace_period,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry))
        except Exception as exc:  # driver missing, refused, bad URL, auth, disk: one line
            if _creating_race(exc) and attempt < 2:
                time.sleep(1 + attempt)  # another worker was creating the tables just then
                continue
            raise SweepConfigError(f"storage {redact(url)}: unreachable or unusable: "
                                   f"{_reason(exc)}") from None
    raise AssertionError("unreachable")


def _creating_race(exc: BaseException) -> bool:
    """True for the errors two processes get when both create the tables at once."""
    text = str(exc).lower()
    return any(s in text for s in ("already exists", "database is locked", "duplicate key"))


def _reason(exc: BaseException) -> str:
    inner = getattr(exc, "orig", None) or exc
    text = " ".join(str(inner).split()) or type(inner).__name__
    return text[:200]
