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


#: pydantic's error types for a value of the wrong JSON type, and the type OpenAI names.
_EXPECTED = {"int_type": "an integer", "bool_type": "a boolean", "string_type": "a string",
             "float_type": "a number", "list_type": "an array", "dict_type": "an object",
             "model_type": "an object", "model_attributes_type": "an object",
             "none_required": "null"}

_GOT = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
        list: "an array", dict: "an object", type(None): "null"}


#: The tags pydantic puts in an error's location for the member of a union that failed.
_UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _param(loc: tuple[Any, ...]) -> str:
    """``("body", "messages", 0, "content", "str")`` as OpenAI writes it:
    ``messages[0].content`` (pydantic's union-member tags dropped)."""
    out = ""
    for part in loc[1:] if loc[:1] == ("body",) else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).isidentifier() or str(part) in _UNION_TAGS:
            break  # a union member's tag (``str``, ``list[...]``): the parameter ends here
        else:
            out += f".{part}" if out else str(part)
    return out



def _message(where: str, group: list[dict[str, Any]]) -> tuple[str, str]:
    """One parameter's message and OpenAI's code, from pydantic's errors about it (several
    when the parameter takes a union and no member matched)."""
    kinds = [str(e.get("type", "")) for e in group]
    if all(kind in _EXPECTED for kind in kinds) and where:
        expected = " or ".join(dict.fromkeys(_EXPECTED[kind] for kind in kinds))
        got = {_GOT.get(type(e.get("input")), "another type") for e in group}
        if len(got) == 1:
            return (f"Invalid type for '{where}': expected {expected}, but got {got.pop()} "
                    "instead.", "invalid_type")
        return f"Invalid type for '{where}'.", "invalid_type"
    e = next(e for e in group if str(e.get("type", "")) not in _EXPECTED)
    kind = str(e.get("type", ""))
    if kind == "missing":
        return f"Missing required parameter: '{where}'.", "missing_required_parameter"
    if kind == "extra_forbidden":
        return f"Unrecognized request argument supplied: {where}", "unknown_parameter"
    msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
    return (f"Invalid value for '{where}': {msg}" if where else msg), "invalid_value"


def validation_error(err: RequestValidationError) -> OpenAIError:
    """A request that breaks the schema, as OpenAI answers it: 400,
    ``invalid_request_error``, the parameter, and ``invalid_type`` (a value of the wrong JSON
    type: nothing is coerced), ``missing_required_parameter``, ``unknown_parameter`` or
    ``invalid_value``; a body that is not JSON has neither parameter nor code."""
    errors = list(err.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return OpenAIError(400, "We could not parse the JSON body of your request: "
                           f"{errors[0].get('msg', 'invalid JSON')}")
    by_param: dict[str, list[dict[str, Any]]] = {}
    for e in errors:
        by_param.setdefault(_param(tuple(e.get("loc", ()))), []).append(dict(e))
    first = next(iter(by_param), "")
    messages = [_message(where, group) for where, group in list(by_param.items())[:3]]
    return OpenAIError(400, " ".join(m for m, _ in messages) or "invalid request",
                       param=first or None, code=messages[0][1] if messages else None)


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
