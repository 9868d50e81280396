"""Pulling an instance image: a limit on silence, a retry after a stall or a transient error, none
after a definitive refusal (the registry says the image does not exist, or that we may not have it)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

PULL_RETRIES = 1
"""Tries after the first. A stall is most often a dropped connection, and a second pull resumes from the
layers already downloaded; a second stall of the same image means the registry or the link is down,
and more tries would only delay the report (of 500 instances, each try costs up to ``pull_timeout_s``)."""

RETRY_PAUSE_S = 1.0
"""Seconds between tries."""

DEFINITIVE = ("manifest unknown", "not found", "unauthorized", "denied", "does not exist",
              "authentication required", "invalid reference format")
"""Registry answers (lower case) that another try cannot change. A DNS failure ("no such host") or a
refused connection is not one of them: it may pass."""

PLATFORMS = {"linux/amd64": "x86_64", "linux/arm64": "arm64"}
"""The platforms an instance image can be pulled for, and swebench's name for each one's architecture."""


@dataclass(frozen=True)
class PullResult:
    ok: bool
    reason: str = ""  # why it failed, each try's reason
    tries: int = 1
    definitive: bool = False  # the registry refused it for good: not tried again


def definitive(reason: str) -> bool:
    """Whether a pull's failure is the registry's final word (:data:`DEFINITIVE`)."""
    return any(marker in reason.lower() for marker in DEFINITIVE)


def pull_image(client: Any, name: str, *, platform: str | None = None, timeout_s: float = 30.0,
               max_s: float = 3600.0, retries: int = PULL_RETRIES, pause_s: float = RETRY_PAUSE_S) -> PullResult:
    """Pull ``name`` (for ``platform``, or the daemon's own), giving up on a try after ``timeout_s``
    without progress or ``max_s`` in all; a try that fails for a reason that is not :func:`definitive`
    is repeated, ``retries`` times at most."""
    reasons: list[str] = []
    for n in range(1, retries + 2):
        reason = pull_once(client, name, platform=platform, timeout_s=timeout_s, max_s=max_s)
        if reason is None:
            return PullResult(True, tries=n)
        reasons.append(reason)
        if definitive(reason):
            return PullResult(False, "; then ".join(reasons), n, definitive=True)
        if n <= retries:
            time.sleep(pause_s)
    return PullResult(False, "; then ".join(reasons), retries + 1)


def pull_once(client: Any, name: str, *, platform: str | None, timeout_s: float, max_s: float) -> str | None:
    """One try: None when ``name`` is then present, else why not."""
    from docker.utils import parse_repository_tag

    repository, tag = parse_repository_tag(name)
    started = time.monotonic()
    outcome: dict[str, Any] = {"last_event": started}

    def pull() -> None:
        try:
            for event in client.api.pull(repository, tag=tag or "latest", stream=True, decode=True,
                                         platform=platform):
                outcome["last_event"] = time.monotonic()
                if isinstance(event, dict) and event.get("error"):
                    raise RuntimeError(event["error"])
            client.images.get(name)
            outcome["ok"] = True
        except Exception as exc:  # noqa: BLE001 - reported below
            outcome["error"] = f"{type(exc).__name__}: {exc}"

    # The time limit is on silence (no progress from the registry), so that a slow but moving
    # download of a multi-GB image goes on, and an unreachable registry fails fast. A stalled try's
    # thread is left behind (a daemon thread blocked on the stream); the next try starts afresh.
    worker = threading.Thread(target=pull, name=f"pull-{name}", daemon=True)
    worker.start()
    while True:
        worker.join(0.05 if timeout_s < 1 else 0.25)
        if not worker.is_alive():
            break
        now = time.monotonic()
        if now - outcome["last_event"] > timeout_s:
            return f"no progress for {timeout_s:g} s"
        if now - started > max_s:
            return f"not done within {max_s:g} s"
    return None if outcome.get("ok") else outcome.get("error", "the pull ended without a result")
