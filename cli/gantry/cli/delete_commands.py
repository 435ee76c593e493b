"""`gantry delete KIND ID`: one command, one kind per object that can be deleted.

Each kind registers itself with `add_delete_kind` when its module is imported (main.py imports
every command module, and so every kind, before it builds the parser): `deployment` in
deployment_commands.py; artifact sets and nodes the same way from their own modules. Every kind's
parser gets the ID and `--output`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import CommandContext
from gantry.cli.output import add_output_argument

# The handler reads the object's id from `args.object_id`.
DeleteHandler = Callable[[CommandContext, argparse.Namespace], int]


@dataclass(frozen=True, slots=True)
class DeleteKind:
    name: str
    handler: DeleteHandler
    help_text: str
    id_metavar: str
    configure: Callable[[CommandSpec], None] | None = None


DELETE_KINDS: dict[str, DeleteKind] = {}


def add_delete_kind(
    name: str,
    handler: DeleteHandler,
    help_text: str,
    *,
    id_metavar: str = "ID",
    configure: Callable[[CommandSpec], None] | None = None,
) -> None:
    """Make `gantry delete NAME ID` call `handler`; `configure` adds the kind's own options."""
    if name in DELETE_KINDS:
        raise ValueError(f"`gantry delete {name}` is registered twice")
    DELETE_KINDS[name] = DeleteKind(
        name=name,
        handler=handler,
        help_text=help_text,
        id_metavar=id_metavar,
        configure=configure,
    )


def add_delete_arguments(parser: CommandSpec, options: CommandSpec) -> None:
    """`delete KIND ID` for every registered kind (without a kind: the help, exit 2)."""
    kinds = parser.add_subparsers(title="kinds", metavar="KIND")
    for kind in sorted(DELETE_KINDS.values(), key=lambda k: k.name):
        sub = kinds.add_parser(
            kind.name, parents=[options], help=kind.help_text, description=kind.help_text
        )
        sub.set_defaults(handler=kind.handler)
        sub.add_argument("object_id", metavar=kind.id_metavar)
        add_output_argument(sub)
        if kind.configure is not None:
            kind.configure(sub)
