"""Secrets are hashed at rest and compared in constant time; generations grow and fit BIGINT."""

from __future__ import annotations

import hmac
from unittest import mock

from gantry.common import tokens
from gantry.common.ids import new_generation


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


def test_generations_increase_with_time_and_fit_a_signed_bigint():
    earlier = new_generation(now_ns=1_800_000_000_000_000_000)
    later = new_generation(now_ns=1_800_000_000_000_001_000)  # one microsecond on
    assert later > earlier
    assert 0 < new_generation() < 2**63
    # Two starts in the same microsecond still (almost always) differ in the random bits.
    same = {new_generation(now_ns=1_800_000_000_000_000_000) for _ in range(20)}
    assert len(same) > 1
