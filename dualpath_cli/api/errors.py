"""Errors a client of the API reports: one line each, with the exit code front-ends use.

Light on purpose (no httpx, no FastAPI): the real client and the shipped fake raise the same
types, so a front-end's error handling is tested without a server.
"""

from __future__ import annotations

from dualpath_cli.errors import EXIT_USAGE, DualPathError

__all__ = ["ApiError", "Unreachable", "Unauthorized", "Forbidden", "Rejected", "NotReady",
           "ServerError", "error_for_status"]


class ApiError(DualPathError):
    """An API call that failed; ``status`` is the HTTP status (None: no answer at all)."""

    status: int | None = None

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(" ".join(message.split()))
        if status is not None:
            self.status = status


class Unreachable(ApiError):
    """No answer: nothing listens at the URL, the connection broke, or it timed out."""

    exit_code = 3


class Unauthorized(ApiError):
    """401: the endpoint needs the bearer token and none was sent."""

    status = 401


class Forbidden(ApiError):
    """403: the bearer token sent is not this cluster's."""

    status = 403


class Rejected(ApiError):
    """400/404/422: the request or its values were refused; the message says why."""

    status = 422
    exit_code = EXIT_USAGE


class NotReady(ApiError):
    """503: the cluster is starting or draining."""

    status = 503


class ServerError(ApiError):
    """Any other error status (a bug on the server side)."""

    status = 500


def error_for_status(status: int, detail: str, url: str) -> ApiError:
    """The error for an HTTP error ``status`` with the server's one-line ``detail``."""
    cls: type[ApiError]
    if status == 401:
        cls = Unauthorized
    elif status == 403:
        cls = Forbidden
    elif status in (400, 404, 405, 409, 422):
        cls = Rejected
    elif status == 503:
        cls = NotReady
    else:
        cls = ServerError
    return cls(f"{url}: HTTP {status}: {detail}", status)
