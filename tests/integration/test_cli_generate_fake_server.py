"""`gantry generate`'s request from its flags, and `gantry profile --max-new-tokens` against the
in-memory fake control plane (the streaming itself: tests/integration/test_cli_generate.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gantry.cli.generate_command import generate_request
from gantry.cli.main import build_parser, main
from tests.integration.test_cli_bootstrap import (
    CLIENT_KEY,
    OPERATOR_TOKEN,
    FakeServer,
    running_fake,
)


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    with running_fake() as server:
        yield server


@pytest.fixture
def state(tmp_path: Path) -> Path:
    (tmp_path / "operator.token").write_text(OPERATOR_TOKEN + "\n")
    (tmp_path / "client.key").write_text(CLIENT_KEY + "\n")
    return tmp_path


def _request(*argv: str):  # type: ignore[no-untyped-def]
    args = build_parser().parse_args(["generate", *argv])
    return generate_request(args, args.prompt)


def test_a_prompt_is_sent_as_one_with_greedy_sampling_and_the_servers_default_tokens():
    request = _request("Once upon a time", "--capability", "tiny-chat")
    assert (request.capability, request.prompt, list(request.messages)) == (
        "tiny-chat",
        "Once upon a time",
        [],
    )
    assert request.max_tokens == 0 and list(request.stop) == []  # the server fills max_tokens
    assert request.sampling.temperature == 0 and request.sampling.seed == 0


def test_chat_and_system_send_messages_and_every_sampling_flag_is_carried():
    request = _request(
        *("Hi", "--deployment-id", "dep-1", "--system", "Be brief.", "--max-tokens", "9"),
        *("--stop", "\n", "--stop", "END", "--temperature", "0.5", "--top-p", "0.9"),
        *("--top-k", "40", "--seed", "7"),
    )
    assert request.deployment_id == "dep-1" and not request.prompt
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "Be brief."),
        ("user", "Hi"),
    ]
    assert (request.max_tokens, list(request.stop)) == (9, ["\n", "END"])
    assert (request.sampling.top_k, request.sampling.seed) == (40, 7)
    assert request.sampling.temperature == pytest.approx(0.5)
    assert [
        (m.role, m.content) for m in _request("Hi", "--capability", "c", "--chat").messages
    ] == [("user", "Hi")]


def test_a_call_with_no_target_or_a_negative_count_is_a_usage_error(
    state: Path, capsys: pytest.CaptureFixture[str]
):
    for argv in (["generate", "Hi"], ["generate", "Hi", "--capability", "c", "--max-tokens", "-1"]):
        with pytest.raises(SystemExit) as exited:
            main(["--state-dir", str(state), *argv])
        assert exited.value.code == 2
    assert "--max-tokens" in capsys.readouterr().err


def test_profile_sends_max_new_tokens_and_prints_it(
    fake: FakeServer, state: Path, capsys: pytest.CaptureFixture[str]
):
    def gantry(*argv: str) -> int:
        return main(["--address", fake.address, "--state-dir", str(state), *argv])

    with pytest.raises(SystemExit):
        gantry("profile", "--help")
    usage = " ".join(capsys.readouterr().out.split())
    assert "transformers_causal_lm (text generation in a model host)" in usage
    lm = ("--adapter", "transformers_causal_lm", "--max-new-tokens", "64")
    assert gantry("profile", "asm-1", "--name", "lm-cpu", *lm) == 0
    sent = fake.control_plane.profiles[-1].adapter
    assert (sent.adapter, sent.max_new_tokens) == ("transformers_causal_lm", 64)
    assert "generation   max_new_tokens=64" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        gantry("profile", "asm-1", "--name", "bad", *lm[:2], "--max-new-tokens", "0")
    assert exited.value.code == 2
    assert len(fake.control_plane.profiles) == 1
