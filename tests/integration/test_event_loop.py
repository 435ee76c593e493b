"""The services' event loop choice (gantry.common.event_loop): asyncio's unless uvloop is asked
for and installed; asked for and missing, asyncio's with a warning, never a failure to start."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from gantry.common import event_loop


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_asyncio_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(event_loop.EVENT_LOOP_ENV, raising=False)
    assert event_loop.run(_loop_module()).startswith("asyncio")


def test_uvloop_when_asked_and_installed_else_asyncio(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(event_loop.EVENT_LOOP_ENV, "uvloop")
    module = event_loop.run(_loop_module())
    if importlib.util.find_spec("uvloop") is not None:
        assert module.startswith("uvloop")
    else:
        assert module.startswith("asyncio")
        assert "uvloop is not installed" in caplog.text
