"""OpenAI's error shape for the OpenAI-compatible routes: the error, its schema, its route class.

Why apart from the control API's errors: those routes answer ``{"detail": ...}``; OpenAI
clients expect ``{"error": {"message", "type", "param", "code"}}`` from these routes only.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from dualpath_cli.services.live import Draining

__all__ = ["OpenAIError", "OpenAIRoute", "ErrorDetail", "ErrorResponse", "ERRORS",
           "draining_error", "validation_error"]


class OpenAIError(Exception):
    """An error answered in OpenAI's JSON shape with an HTTP status."""

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = " ".join(message.split())
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers

    def tagged(self, headers: Mapping[str, str]) -> OpenAIError:
        """This error with ``headers`` added (a turn's ``x-request-id``)."""
        self.headers = {**(self.headers or {}), **headers}
        return self

    def response(self) -> JSONResponse:
        """The error as a response."""
        return JSONResponse({"error": {"message": self.message, "type": self.type,
                                       "param": self.param, "code": self.code}},
                            self.status, headers=self.headers)


def draining_error(err: Draining) -> OpenAIError:
    return OpenAIError(503, str(err), type_="service_unavailable", code="draining",
                       headers={"Retry-After": str(err.retry_after_s)})


def validation_error(err: RequestValidationError) -> OpenAIError:
    errors = list(err.errors())
    parts: list[str] = []
    param: str | None = None
    for e in errors[:3]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc and not msg.startswith(loc) else msg)
        param = param or loc or None
    return OpenAIError(422, "; ".join(parts) or "invalid request", param=param,
                       code="invalid_value")


class OpenAIRoute(APIRoute):
    """Answers schema violations and :class:`OpenAIError` in OpenAI's error shape.

    Why a route class: the app's exception handlers answer ``{"detail": ...}`` (the control
    API's shape); OpenAI clients expect ``{"error": {...}}`` from these routes only.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as err:
                return validation_error(err).response()
            except OpenAIError as err:
                return err.response()
            except StarletteHTTPException as err:  # e.g. a body that is not even text
                return OpenAIError(err.status_code, str(err.detail),
                                   headers=err.headers).response()

        return run


class ErrorDetail(BaseModel):
    """OpenAI's error object."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every error of these routes."""

    error: ErrorDetail


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 404, 422, 503, 504)}
