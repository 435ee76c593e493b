"""The plain tables every listing prints (gantry.cli.tables.render_table, laid out by Rich)."""

from __future__ import annotations

import pytest

from gantry.cli.tables import render_table


def test_columns_are_left_aligned_two_spaces_apart_without_trailing_spaces() -> None:
    table = render_table(["ID", "STATE"], [["dep-1", "READY"], ["d", "FAILED"]])
    assert table.splitlines() == ["ID     STATE", "dep-1  READY", "d      FAILED"]


def test_the_header_prints_even_with_no_rows() -> None:
    assert render_table(["ID", "STATE"], []) == "ID  STATE"


def test_a_narrow_terminal_never_wraps_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "10")
    row = ["x" * 50, "y" * 50]
    assert render_table(["A", "B"], [row]).splitlines()[1] == "  ".join(row)


def test_a_cell_prints_as_it_is() -> None:
    """No Rich markup, no highlighting, no colour: brackets and escapes are data."""
    table = render_table(["NAME"], [["[bold]x[/bold]"], ["\\[y]"]])
    assert table.splitlines()[1:] == ["[bold]x[/bold]", "\\[y]"]
    assert "\x1b" not in table


def test_wide_characters_and_tabs_keep_the_columns_aligned() -> None:
    wide = render_table(["A", "B"], [["中文", "1"], ["ab", "2"]])
    assert wide.splitlines() == ["A     B", "中文  1", "ab    2"]
    tab = render_table(["A", "B"], [["a\tb", "3"]])
    assert tab.splitlines()[1] == "a       b  3"  # a tab is expanded, never dropped
