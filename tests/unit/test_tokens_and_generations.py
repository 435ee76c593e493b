"""Secrets are hashed at rest and compared in constant time; generations grow and fit BIGINT."""

from __future__ import annotations

import hmac
from unittest import mock

import pytest

from gantry.common import tokens
from gantry.common.ids import GENERATION_LIMIT, GENERATION_STEP, next_generation


def test_a_minted_token_parses_back_to_its_kind_and_id():
    token = tokens.mint_token(tokens.API_KEY, "key-1")
    parsed = tokens.parse_token(token, kind=tokens.API_KEY)
    assert parsed is not None and parsed.token_id == "key-1" and len(parsed.secret) >= 43
    assert tokens.parse_token(token, kind=tokens.OPERATOR_TOKEN) is None
    assert tokens.parse_token("garbage", kind=tokens.API_KEY) is None


def test_tokens_are_random_and_stored_only_as_a_hash():
    first = tokens.mint_token(tokens.NODE_CREDENTIAL, "n")
    second = tokens.mint_token(tokens.NODE_CREDENTIAL, "n")
    assert first != second
    stored = tokens.hash_token(first)
    assert first not in stored and len(stored) == 64
    assert tokens.token_matches(first, stored)
    assert not tokens.token_matches(second, stored)


def test_comparison_is_constant_time():
    token = tokens.mint_token(tokens.OPERATOR_TOKEN, "op")
    with mock.patch.object(hmac, "compare_digest", wraps=hmac.compare_digest) as compare:
        tokens.token_matches(token, tokens.hash_token(token))
    compare.assert_called_once()


def test_issued_generations_increase_unpredictably_and_fit_a_signed_bigint():
    issued = [next_generation(1000) for _ in range(20)]
    assert all(1000 < generation <= 1000 + GENERATION_STEP for generation in issued)
    # Not guessable from the stored one: a credential holder cannot name the next.
    assert len(set(issued)) > 1
    assert next_generation(GENERATION_LIMIT - GENERATION_STEP - 1) <= GENERATION_LIMIT < 2**63
    with pytest.raises(OverflowError):
        next_generation(GENERATION_LIMIT)
