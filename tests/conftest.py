"""Shared fixtures. Tests that need the real vLLM use the session-wide ``vllm_endpoint``.

Real-part tests skip with a reason when their part is missing, unless CI makes them mandatory:
``SAO_REQUIRE_VLLM=1`` turns a missing vLLM or model into a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def shared_file(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"{path} is not present (benchmark copies live in ../shared/data)")
    return path


def _require(what: str, why: str) -> None:
    """Skip, or fail when CI made the real part mandatory."""
    if os.environ.get("SAO_REQUIRE_VLLM") == "1":
        pytest.fail(f"{what} is required here (SAO_REQUIRE_VLLM=1) but {why}")
    pytest.skip(f"{what}: {why}")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The prepared SmolLM2-135M-Instruct checkpoint (`sao-model prepare smollm2-135m`)."""
    from sao.agents.model import resolve_model

    try:
        return Path(resolve_model("smollm2-135m"))
    except Exception as exc:  # noqa: BLE001
        _require("the bundled model", f"it is not prepared ({exc})")
