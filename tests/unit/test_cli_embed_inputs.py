"""`gantry embed`'s inputs: texts from arguments, files and standard input, split into calls that
stay inside the control plane's bounds; unreadable files and empty input refused before any call."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from gantry.cli.embed import gather_texts, non_empty_lines, split_calls
from gantry.cli.errors import CliError
from gantry.cli.main import main
from gantry.common.inference_limits import MAX_INPUTS

UNREACHABLE = "127.0.0.1:1"  # every case here ends before a call is made


def test_arguments_come_first_then_each_file_in_the_order_given(tmp_path: Path) -> None:
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("one whole\ntext\n")
    second.write_text("alpha\n\n  \r\nbeta\r\n")
    stdin = io.BytesIO(b"from stdin\n")

    whole = gather_texts(["arg"], [str(first), "-"], lines=False, stdin=stdin)
    assert whole == ["arg", "one whole\ntext\n", "from stdin\n"]

    per_line = gather_texts([], [str(second), str(first)], lines=True, stdin=io.BytesIO())
    assert per_line == ["alpha", "beta", "one whole", "text"]


def test_only_lines_holding_more_than_whitespace_are_texts() -> None:
    assert non_empty_lines("a\r\n\n \t\nb  \nc") == ["a", "b  ", "c"]
    assert non_empty_lines("\n\n") == []


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("missing.txt", None, "No such file or directory"),
        ("", None, "Is a directory"),
        ("latin1.txt", b"caf\xe9", "not UTF-8 text (byte 3)"),
    ],
    ids=["missing", "directory", "not-utf8"],
)
def test_a_file_that_cannot_be_read_is_named(
    tmp_path: Path, name: str, content: bytes | None, expected: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CliError) as caught:
        gather_texts([], [str(path)], lines=False, stdin=io.BytesIO())
    assert str(caught.value) == f"cannot read {path}: {expected}"


def test_texts_are_split_into_calls_of_at_most_max_inputs_in_order() -> None:
    texts = [f"line {index}" for index in range(2500)]
    calls = split_calls(texts)
    assert [len(call) for call in calls] == [MAX_INPUTS, MAX_INPUTS, 2500 - 2 * MAX_INPUTS]
    assert [text for call in calls for text in call] == texts
    assert split_calls(["one"]) == [["one"]]
    assert split_calls([]) == []


def test_calls_are_also_split_by_their_bytes_of_text() -> None:
    assert split_calls(["aaaa", "bbbb", "cc", "d"], max_text_bytes=6) == [
        ["aaaa"],
        ["bbbb", "cc"],
        ["d"],
    ]
    # One text over the byte bound still travels, alone, for the control plane to refuse by name.
    assert split_calls(["x" * 10, "y"], max_text_bytes=4) == [["x" * 10], ["y"]]
    assert split_calls(["é", "é", "é"], max_text_bytes=4) == [["é", "é"], ["é"]]


def test_an_unreadable_file_is_one_line_naming_it_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.txt"
    argv = ["--address", UNREACHABLE, "--state-dir", str(tmp_path), "embed", "--file", str(missing)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == f"error: cannot read {missing}: No such file or directory\n"


def test_no_texts_at_all_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    base = ["--address", UNREACHABLE, "--state-dir", str(tmp_path), "embed"]
    for extra in ([], ["--file", str(blank), "--lines"]):
        with pytest.raises(SystemExit) as caught:
            main([*base, *extra])
        assert caught.value.code == 2
        assert "gantry embed: error:" in capsys.readouterr().err
