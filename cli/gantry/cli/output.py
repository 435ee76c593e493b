"""`--output json|table` for every command that lists or shows records.

JSON is the proto's own field names (as grpcurl prints them), so a script can parse `gantry ...
--output json` and a grpcurl answer alike; a list is a JSON array, one record an object.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message

from gantry.cli.click_parser import CommandSpec
from gantry.cli.tables import render_table

OUTPUT_FORMATS = ("table", "json")
M = TypeVar("M", bound=Message)


def add_output_argument(parser: CommandSpec) -> None:
    """`--output table|json` (`-o`), and `--json` as its short spelling."""
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUT_FORMATS,
        default="table",
        help="table (default) or json (the proto's field names, as grpcurl prints them)",
    )
    parser.add_argument(
        "--json", dest="output", action="store_const", const="json", help="same as --output json"
    )


def wants_json(args: argparse.Namespace) -> bool:
    return getattr(args, "output", "table") == "json"


def message_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def print_json(value: Message | Sequence[Message] | dict[str, Any] | list[Any]) -> None:
    if isinstance(value, Message):
        document: Any = message_dict(value)
    elif isinstance(value, dict):
        document = value
    else:
        document = [message_dict(item) if isinstance(item, Message) else item for item in value]
    print(json.dumps(document, indent=2))


def print_records(
    args: argparse.Namespace,
    records: Sequence[M],
    headers: Sequence[str],
    row: Callable[[M], Sequence[str]],
) -> None:
    """A table of `row(record)` under `headers`, or the records as a JSON array."""
    if wants_json(args):
        print_json(records)
    else:
        print(render_table(headers, [list(row(record)) for record in records]))


def print_secret_record(
    args: argparse.Namespace,
    response: Message,
    *,
    secret_field: str,
    fields: Sequence[tuple[str, str]],
    written_to: Path | None,
) -> None:
    """A response that carries a secret shown once (a node credential, a client key): the record
    with the secret, or with where it was written (then the JSON omits it: it is kept in the file
    only). The caller writes the file first."""
    if wants_json(args):
        shown = type(response)()
        shown.CopyFrom(response)
        if written_to is not None:
            shown.ClearField(secret_field)
        print_json(shown)
        return
    secret = getattr(response, secret_field)
    rows = [*fields, (secret_field, secret if written_to is None else "")]
    width = max(len(name) for name, _ in rows) + 2
    for name, value in rows[:-1]:
        print(f"{name.ljust(width)}{value}")
    where = secret if written_to is None else f"written to {written_to} (mode 0600)"
    print(f"{secret_field.ljust(width)}{where}")
