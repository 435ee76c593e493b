"""gantry.client's settings: the addresses of a target (one, a comma-separated list, a list),
where the API key comes from and in which order, the default and per-call deadline, and TLS."""

from __future__ import annotations

from pathlib import Path

import pytest

from gantry.client.settings import (
    API_KEY_ENV,
    DEFAULT_TIMEOUT_S,
    ClientSettingsError,
    addresses_of,
    api_key_of,
    connection_settings,
    timeout_of,
)


@pytest.mark.parametrize(
    ("target", "addresses"),
    [
        ("127.0.0.1:50051", ("127.0.0.1:50051",)),
        ("a:1, b:2", ("a:1", "b:2")),
        (["a:1", "b:2,c:3"], ("a:1", "b:2", "c:3")),
        ("dns:///gantry:50051", ("dns:///gantry:50051",)),
    ],
)
def test_a_target_is_one_address_or_several(target: str | list[str], addresses: tuple) -> None:
    assert addresses_of(target) == addresses


@pytest.mark.parametrize("target", ["", "a:1,,b:2", [], ["a:1", " "]])
def test_an_empty_address_is_refused(target: str | list[str]) -> None:
    with pytest.raises(ClientSettingsError):
        addresses_of(target)


def _key(api_key: str | None = None, text: str | None = None, **env: str) -> str:
    return api_key_of(api_key=api_key, key_file_text=text, key_file="k", env=env)


def test_the_key_comes_from_the_argument_then_the_file_then_the_environment() -> None:
    assert _key("argument", None, GANTRY_API_KEY="env") == "argument"
    assert _key(None, "file\n", GANTRY_API_KEY="env") == "file"
    assert _key(None, None, GANTRY_API_KEY=" env\n") == "env"


def test_a_missing_empty_or_doubly_given_key_is_refused_by_name() -> None:
    with pytest.raises(ClientSettingsError, match=API_KEY_ENV):
        _key()
    with pytest.raises(ClientSettingsError, match="key_file k is empty"):
        _key(None, "\n")
    with pytest.raises(ClientSettingsError, match="not both"):
        _key("a", "b")


def test_a_call_takes_its_own_deadline_else_the_default_and_never_a_bad_one() -> None:
    assert timeout_of(None, 7.0) == 7.0
    assert timeout_of(0.5, 7.0) == 0.5
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ClientSettingsError):
            timeout_of(bad, 7.0)


def test_settings_read_the_key_file_and_turn_tls_on_with_a_root_certificate(
    tmp_path: Path,
) -> None:
    key_file = tmp_path / "client.key"
    key_file.write_text("key-from-file\n")
    plain = connection_settings(
        "a:1,b:2",
        api_key=None,
        key_file=key_file,
        root_certificates=None,
        tls=False,
        server_name=None,
        timeout=DEFAULT_TIMEOUT_S,
        env={},
    )
    assert plain.addresses == ("a:1", "b:2") and plain.tls is None
    assert plain.metadata == (("authorization", "Bearer key-from-file"),)
    assert plain.timeout_s == DEFAULT_TIMEOUT_S
    secure = connection_settings(
        "a:1",
        api_key=None,
        key_file=None,
        root_certificates=tmp_path / "ca.pem",
        tls=False,
        server_name=None,
        timeout=5,
        env={"GANTRY_API_KEY": "key-from-env"},
    )
    assert secure.metadata == (("authorization", "Bearer key-from-env"),)
    assert secure.tls is not None and secure.tls.ca_file == tmp_path / "ca.pem"
    assert secure.timeout_s == 5
