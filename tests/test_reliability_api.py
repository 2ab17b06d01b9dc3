"""API guards of issue 17 item 4: request bodies over the limit get 413 before a handler
reads them; a token file owned by someone else, or larger than a token, is refused."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from dualpath_cli.api.auth import TokenAuth, TokenFileError
from dualpath_cli.api.bodylimit import BodyLimit


def _echo_app(most: int) -> tuple[Any, list[int]]:
    seen: list[int] = []
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        body = await request.body()
        seen.append(len(body))
        return {"bytes": len(body)}

    return BodyLimit(app, most=most), seen


def _post(app: Any, **kwargs: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/echo", **kwargs)

    return asyncio.run(go())


def test_a_body_over_the_limit_is_413_and_never_reaches_the_handler() -> None:
    app, seen = _echo_app(100)
    assert _post(app, content=b"x" * 100).json() == {"bytes": 100}
    big = _post(app, content=b"x" * 101)
    assert big.status_code == 413 and "limit of 100 bytes" in big.json()["detail"]
    assert "DUALPATH_LIMIT_REQUEST_BYTES" in big.json()["detail"]
    assert seen == [100]


def test_a_chunked_body_is_cut_off_at_the_limit() -> None:
    app, seen = _echo_app(1000)

    async def chunks() -> Any:
        for _ in range(50):
            yield b"y" * 100

    res = _post(app, content=chunks())  # no Content-Length: counted as it arrives
    assert res.status_code == 413 and seen == []


def test_a_bad_content_length_is_400() -> None:
    app, seen = _echo_app(100)
    res = _post(app, content=b"x", headers={"content-length": "lots"})
    assert res.status_code == 400 and seen == []


def test_the_api_app_carries_the_limit() -> None:
    from dualpath_cli.api.app import create_app
    from dualpath_cli.telemetry.gpu import FakeGpuBackend

    class Live:  # the routes read its model when built; a refused body reaches no handler
        opts = SimpleNamespace(model="tiny", api_rate_limit=5000.0)

        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"a handler ran: live.{name}")

    app = create_app(Live(), TokenAuth("t" * 43), gpu=FakeGpuBackend())  # type: ignore[arg-type]
    assert any(m.cls is BodyLimit for m in app.user_middleware)

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/v1/completions", content=b"{" * (17 * 2**20))

    res = asyncio.run(go())
    assert res.status_code == 413 and "limit" in res.json()["detail"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="chown to another user needs root")
def test_a_token_file_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "token"
    TokenAuth.generate(path)
    os.chown(path, 4242, -1)
    with pytest.raises(TokenFileError, match="owned by uid 4242"):
        TokenAuth.load(path)


def test_a_token_file_larger_than_a_token_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("t" * 5000)
    path.chmod(0o600)
    with pytest.raises(TokenFileError, match="larger than a token"):
        TokenAuth.load(path)
    assert TokenAuth.generate(tmp_path / "ok").token == TokenAuth.load(tmp_path / "ok").token
