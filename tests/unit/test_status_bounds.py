"""A status always fits gRPC's trailers: a caller's text is echoed as an excerpt, every ErrorInfo
metadata value is bounded, and the message is cut to a budget of its percent-encoded bytes. A
trailer past gRPC's 8 KiB metadata limit reached the client as RESOURCE_EXHAUSTED without the
ErrorInfo (issue 26, item 9)."""

from __future__ import annotations

import base64

import pytest

from gantry.common.errors import METADATA_VALUE_CHARS, GantryError, excerpt, not_found
from gantry.common.status import WIRE_MESSAGE_BYTES, to_rich_status, wire_message

GRPC_METADATA_LIMIT = 8 * 1024


def percent_encoded(text: str) -> bytes:
    """grpc-message as gRPC writes it: every byte that is not printable ASCII, and '%', as %XX."""
    return b"".join(
        bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}".encode()
        for b in text.encode("utf-8")
    )


def trailer_bytes(error: GantryError) -> int:
    status = to_rich_status(error)
    details = dict(status.trailing_metadata)["grpc-status-details-bin"]
    return len(percent_encoded(status.details)) + len(base64.b64encode(details))


def test_excerpt_keeps_short_text_and_cuts_long_text_saying_its_length() -> None:
    assert excerpt("embed") == "embed"
    cut = excerpt("m" * 1_000_000)
    assert cut.startswith("m" * 120) and cut.endswith("… (1000000 characters)")


def test_metadata_values_are_bounded_when_the_error_is_made() -> None:
    error = GantryError("NOT_FOUND", "gone", capability="x" * 1_000_000, kind="capability")
    assert len(error.metadata["capability"]) < METADATA_VALUE_CHARS + 40
    assert error.metadata["kind"] == "capability"


def test_not_found_echoes_an_excerpt() -> None:
    error = not_found("model", "y" * 1_000_000)
    assert len(error.message) < 200 and "(1000000 characters)" in error.message


@pytest.mark.parametrize("char", ["x", "%", "é", "🙂", "\n"])
def test_wire_message_fits_its_budget_whatever_the_characters(char: str) -> None:
    message = char * 1_000_000
    cut = wire_message(message)
    assert len(percent_encoded(cut)) <= WIRE_MESSAGE_BYTES
    assert cut.endswith("(1000000 characters)")


def test_a_message_within_the_budget_is_sent_whole() -> None:
    message = "q" * WIRE_MESSAGE_BYTES
    assert wire_message(message) == message


def test_a_status_from_huge_caller_text_fits_the_trailer() -> None:
    error = GantryError("INVALID_ARGUMENT", "🙂" * 1_000_000, field="name", value="é" * 1_000_000)
    error.metadata["late"] = "z" * 1_000_000  # set after construction: bounded at the wire
    assert trailer_bytes(error) < GRPC_METADATA_LIMIT * 3 // 4  # room for the rest
