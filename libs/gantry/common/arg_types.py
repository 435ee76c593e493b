"""argparse `type=` functions shared by the CLI and the services' command lines: a bad value is a
usage error naming the flag (exit 2), never a traceback."""

from __future__ import annotations

import argparse


def non_negative(text: str) -> int:
    """A whole number that is 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def positive(text: str) -> int:
    """A whole number above 0."""
    value = non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("0 is not above 0")
    return value


def positive_seconds(text: str) -> float:
    """A number of seconds above 0 (a NaN is not above 0)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
    return value
