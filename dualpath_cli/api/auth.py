"""The bearer token that guards control of a running cluster.

Why a file: ``dualpath launch`` generates a fresh token and writes it where only its owner
can read it (mode 0600); local tools (``dualpath status``, the monitor, tune) read the file
named in the state file, and nobody else on the host can. A token file that group or others
can read is refused rather than used, since its secret may already have leaked; so is one
owned by another user (who could have planted it). The audit
log records a short *token id* (a hash prefix), never the token; comparisons are constant
time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from dualpath_cli.atomicio import atomic_write_text
from dualpath_cli.errors import DualPathError

__all__ = ["TokenAuth", "TokenFileError", "AuthError", "MissingToken", "WrongToken",
           "token_id"]

_PREFIX = "Bearer "
_MOST = 1024  # characters a token file may hold


class TokenFileError(DualPathError):
    """A token file that cannot be used (unreadable, empty, or readable by others)."""


class AuthError(DualPathError):
    """A request without valid credentials; ``status`` is its HTTP status."""

    status = 401


class MissingToken(AuthError):
    """No bearer token was sent (HTTP 401)."""

    status = 401


class WrongToken(AuthError):
    """A bearer token was sent and is not this cluster's (HTTP 403)."""

    status = 403


def token_id(token: str) -> str:
    """A short, stable id for ``token`` (safe to log: 8 hex digits of its SHA-256)."""
    return "tok-" + hashlib.sha256(token.encode("utf-8")).hexdigest()[:8]


class TokenAuth:
    """One cluster's token: check requests against it, name it in the audit log.

    Build with :meth:`generate` (launch), :meth:`load` (a client reading the file) or
    :meth:`load_or_generate`. ``repr`` and ``str`` never show the token.
    """

    def __init__(self, token: str, path: Path | None = None) -> None:
        if not token or token != token.strip():
            raise TokenFileError("a token must be non-empty and have no surrounding spaces")
        self._token = token.encode("utf-8")
        self.token_id = token_id(token)
        self.path = path

    def __repr__(self) -> str:
        where = f", path={str(self.path)!r}" if self.path else ""
        return f"TokenAuth(id={self.token_id!r}{where})"

    __str__ = __repr__

    @property
    def token(self) -> str:
        """The secret itself (for a client's ``Authorization`` header; never log it)."""
        return self._token.decode("utf-8")

    # -- files --------------------------------------------------------------------------
    @classmethod
    def generate(cls, path: str | os.PathLike[str]) -> TokenAuth:
        """A fresh random token written atomically to ``path`` with mode 0600.

        The parent directory is created (mode 0700) when missing.
        """
        target = Path(path)
        try:
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            token = secrets.token_urlsafe(32)
            atomic_write_text(target, token + "\n", mode=0o600)
        except OSError as err:
            raise TokenFileError(f"cannot write token file {target}: {err.strerror or err}"
                                 ) from None
        return cls(token, target)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TokenAuth:
        """The token in ``path``; refused when group or others may read or write it."""
        target = Path(path)
        try:
            fd = os.open(target, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))  # POSIX only
        except FileNotFoundError:
            raise TokenFileError(f"token file {target} does not exist") from None
        except OSError as err:
            raise TokenFileError(f"cannot read token file {target}: {err.strerror or err}"
                                 ) from None
        with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as handle:
            info = os.fstat(handle.fileno())
            mode = info.st_mode
            if not stat.S_ISREG(mode):
                raise TokenFileError(f"token file {target} is not a regular file")
            if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
                raise TokenFileError(
                    f"token file {target} is owned by uid {info.st_uid}, not by this user "
                    f"(uid {os.geteuid()}); someone else could have written it, so it is "
                    "refused")
            if mode & 0o077:
                raise TokenFileError(
                    f"token file {target} has mode {stat.S_IMODE(mode):04o}; group or others "
                    f"can access it, so it is refused (chmod 600 {target}, or delete it to get "
                    "a new token)")
            text = handle.read(_MOST + 1).strip()  # a token is 43 characters
        if len(text) > _MOST:
            raise TokenFileError(f"token file {target} is larger than a token "
                                 f"({_MOST} characters at most)")
        if not text:
            raise TokenFileError(f"token file {target} is empty")
        return cls(text, target)

    @classmethod
    def load_or_generate(cls, path: str | os.PathLike[str]) -> TokenAuth:
        """The token in ``path`` when the file exists (checked as :meth:`load`), else a new one."""
        if Path(path).exists():
            return cls.load(path)
        return cls.generate(path)

    # -- checking -----------------------------------------------------------------------
    def matches(self, token: str) -> bool:
        """Whether ``token`` is this cluster's (constant-time comparison)."""
        return hmac.compare_digest(token.encode("utf-8"), self._token)

    def check_header(self, authorization: str | None) -> None:
        """Accept an ``Authorization: Bearer <token>`` header value or raise.

        Raises:
            MissingToken: no header, or not a bearer token (401).
            WrongToken: a bearer token that does not match (403).
        """
        if not authorization or not authorization.startswith(_PREFIX):
            raise MissingToken("this endpoint needs the cluster's bearer token "
                               "(Authorization: Bearer <token from the token file>)")
        if not self.matches(authorization[len(_PREFIX):].strip()):
            raise WrongToken("the bearer token does not match this cluster's token")
