"""Typer groups built on first use, so that ``dualpath --help`` does not build every command.

Typer turns every command of every group into click objects (inspecting signatures,
evaluating annotations) before it parses the command line; for ``dualpath --help`` and
``dualpath sim run`` that is wasted on the other groups. A deferred group is registered with
its name, help and no-args behaviour only, and builds the real group when a sub-command is
listed or looked up (``--help`` of the group, a run, shell completion, docs/cli.md).
"""

from __future__ import annotations

from typing import Any, ClassVar

import typer
import typer.core
import typer.main
import typer.models

from dualpath_cli.cli.helptext import reflow_command

__all__ = ["deferred"]


class _DeferredGroup(typer.core.TyperGroup):
    """A group whose sub-commands Typer builds from :attr:`source` on first use."""

    source: ClassVar[typer.Typer]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._built: Any = None

    def _real(self) -> Any:
        if self._built is None:
            self._built = reflow_command(typer.main.get_group(self.source))
        return self._built

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self._real().list_commands(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        return self._real().get_command(ctx, cmd_name)


def deferred(sub: typer.Typer) -> typer.Typer:
    """``sub`` as a group for :meth:`typer.Typer.add_typer` that is built only when used.

    ``sub`` may have commands but no callback of its own (a group's options would have to be
    parsed before the group is built).
    """
    own_callback = not isinstance(sub.info.callback, typer.models.DefaultPlaceholder)
    if sub.registered_callback is not None or own_callback:
        raise ValueError("deferred(): the group has a callback; register it with add_typer")
    group_cls = type("DeferredGroup", (_DeferredGroup,), {"source": sub})
    return typer.Typer(cls=group_cls, help=sub.info.help,
                       no_args_is_help=sub.info.no_args_is_help, add_completion=False)
