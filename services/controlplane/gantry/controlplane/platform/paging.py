"""Keyset paging for List RPCs: the page token is the last key of the previous page."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from gantry.common.errors import invalid_argument

T = TypeVar("T")
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


@dataclass(frozen=True, slots=True)
class Page:
    after: str
    size: int

    @property
    def fetch(self) -> int:
        return self.size + 1  # one extra row says whether another page exists

    def split(self, rows: Sequence[T], *, key: Callable[[T], str]) -> tuple[Sequence[T], str]:
        if len(rows) <= self.size:
            return rows, ""
        items = rows[: self.size]
        return items, encode_token(key(items[-1]))


def encode_token(last_key: str) -> str:
    return base64.urlsafe_b64encode(last_key.encode()).decode()


def page_of(page_size: int, page_token: str) -> Page:
    if page_size < 0:
        raise invalid_argument("page_size must not be negative", field="page_size")
    size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
    if not page_token:
        return Page(after="", size=size)
    try:
        after = base64.urlsafe_b64decode(page_token.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise invalid_argument(
            "page_token is not one this server issued", field="page_token"
        ) from None
    return Page(after=after, size=size)
