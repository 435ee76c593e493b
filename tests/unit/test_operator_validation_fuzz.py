"""Fuzzing the operator API's validation: any input is accepted or refused with a typed error."""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gantry.common.errors import GantryError
from gantry.common.ids import parse_id
from gantry.controlplane.platform.paging import page_of
from gantry.controlplane.platform.validation import (
    MAX_LABELS,
    _check_labels,
    _check_length,
    _check_name,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _typed_or_ok(call) -> object:  # type: ignore[no-untyped-def]
    try:
        return call()
    except GantryError as error:
        assert error.reason in ("INVALID_ARGUMENT", "ARTIFACT_PATH_INVALID"), error
        return None


@FUZZ
@given(st.text(max_size=300))
@example("abc\n")  # `$` in a regex matches before a trailing newline: fullmatch or nothing
@example("a" * 128)
@example("a" * 129)
@example("-a")
def test_names_are_accepted_only_when_well_formed(value: str):
    accepted = _typed_or_ok(lambda: _check_name(value, field="name"))
    # The rule, written out without a regex: 1-128 characters, ASCII letters, digits, '.', '_'
    # and '-', starting with a letter or digit.
    alnum = string.ascii_letters + string.digits
    well_formed = (
        1 <= len(value) <= 128 and value[0] in alnum and all(c in alnum + "._-" for c in value)
    )
    assert accepted == (value if well_formed else None)


@FUZZ
@given(st.text(max_size=80))
def test_ids_parse_or_are_refused(value: str):
    _typed_or_ok(lambda: parse_id(value, field="id"))


@FUZZ
@given(st.dictionaries(st.text(max_size=80), st.text(max_size=300), max_size=70))
@example({"zone\n": "a"})
def test_labels_within_their_limits_only(labels: dict[str, str]):
    accepted = _typed_or_ok(lambda: _check_labels(labels))
    if accepted is not None:
        assert len(labels) <= MAX_LABELS
        assert all(len(k) <= 63 and "\n" not in k and len(v) <= 256 for k, v in labels.items())


@FUZZ
@given(st.integers(min_value=-(2**31), max_value=2**31 - 1), st.text(max_size=100))
def test_paging_arguments_are_bounded_or_refused(page_size: int, page_token: str):
    page = _typed_or_ok(lambda: page_of(page_size, page_token))
    if page_size < 0:
        assert page is None  # refused, typed
    elif page is not None:
        # 0 asks for the default page of 100; anything larger than 1,000 is cut to 1,000.
        assert page.size == (100 if page_size == 0 else min(page_size, 1000))  # type: ignore[attr-defined]


@pytest.mark.parametrize("limit", [0, 5, 200])
def test_lengths_are_checked_against_their_limit(limit: int):
    assert _check_length("a" * limit, field="f", limit=limit) == "a" * limit
    with pytest.raises(GantryError) as caught:
        _check_length("a" * (limit + 1), field="f", limit=limit)
    assert caught.value.metadata["limit"] == str(limit)


def test_a_huge_name_is_refused_with_an_excerpt_not_an_echo():
    value = "x" * (1 << 20) + "!"  # 1 MiB and one illegal character
    with pytest.raises(GantryError) as refused:
        _check_name(value, field="name")
    assert refused.value.reason == "INVALID_ARGUMENT"
    assert len(refused.value.message) < 1_000
    assert f"({len(repr(value))} characters)" in refused.value.message
