"""The one layout rule of the CLI's tables (cli/table_fit.py): at any width, every line fits and
ids, statuses and figures are whole, or the table is in the documented narrow layout."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len

from gpuledger.cli.table_fit import ELLIPSIS, PIPE_ALIGN_MAX, Column, fit, plain_lines, table_lines

COLUMNS = (
    Column("ID", "key"),
    Column("STATUS", "key"),
    Column("COST", "number", priority=9, right=True),
    Column("KWH", "number", priority=2, right=True),
    Column("USER", "text", priority=8, min_width=4),
    Column("NAME", "text", priority=7, min_width=6),
    Column("TEAM", "text", priority=1, min_width=5),
)

ids = st.text("0123456789abcdefghjkmnpqrstvwxyz", min_size=8, max_size=8)
statuses = st.sampled_from(["running", "succeeded", "failed", "discovered"])
figures = st.floats(0, 1e7, allow_nan=False).map(lambda x: f"{x:.2f}")
# names as people write them: ASCII, accents, CJK and emoji (two terminal columns each)
texts = st.text(
    st.one_of(st.characters(codec="ascii", categories=("L", "N", "P", "Zs")), st.sampled_from("éß漢字テスト🚀")),
    max_size=300,
)
rows_st = st.lists(st.tuples(ids, statuses, figures, figures, texts, texts, texts).map(list), min_size=1, max_size=6)


def _is_table(lines: list[str]) -> bool:
    return not lines[0].startswith("ID: ")  # the narrow layout starts with the first cell


@settings(max_examples=300, deadline=None)
@given(rows=rows_st, width=st.integers(1, 250))
def test_any_width_fits_with_ids_statuses_and_figures_whole(rows: list[list[str]], width: int) -> None:
    lines = table_lines(COLUMNS, rows, width)
    if _is_table(lines):
        assert all(cell_len(line) <= width for line in lines)
        body = lines[1 : 1 + len(rows)]
        for row, line in zip(rows, body, strict=True):  # one line per row, in order
            assert line.startswith(row[0] + "  ") and f"  {row[1]}" in line
        layout = fit(COLUMNS, rows, width)
        assert layout is not None
        for i in layout.shown:  # a figure shown is shown whole, on its row's line
            if COLUMNS[i].kind == "number":
                assert all(row[i] in line for row, line in zip(rows, body, strict=True))
        assert {2}.issubset(layout.shown) or 3 not in layout.shown  # COST goes after KWH, never before
    else:  # the narrow layout: HEADER: value, keys and figures whole, text cut to the width
        assert fit(COLUMNS, rows, width) is None
        for row in rows:
            for column, cell in zip(COLUMNS, row, strict=True):
                if column.kind != "text":
                    assert f"{column.header}: {cell}".rstrip() in lines
        for line in lines:
            label = line.split(": ", 1)[0] + ": "
            if label in ("USER: ", "NAME: ", "TEAM: "):
                assert cell_len(line) <= max(width, len(label) + 2)


@settings(max_examples=200, deadline=None)
@given(rows=rows_st)
def test_piped_lines_keep_every_value_whole_and_are_not_padded_to_a_long_cell(rows: list[list[str]]) -> None:
    clean_rows = [[c.strip() for c in row] for row in rows]
    lines = plain_lines(COLUMNS, clean_rows)
    for row, line in zip(clean_rows, lines[1:], strict=True):
        position = 0
        for cell in row:  # every value, whole, in order
            found = line.find(cell, position)
            assert found >= 0
            position = found + len(cell)
        # no padding beyond the alignment cap: a line is its cells, two spaces apart, plus at most
        # PIPE_ALIGN_MAX of padding per column
        assert len(line) <= sum(len(c) for c in row) + len(row) * (2 + PIPE_ALIGN_MAX)


def test_a_10kb_name_does_not_pad_the_other_piped_lines() -> None:
    rows = [
        ["aaaaaaaa", "failed", "1.00", "2", "ana", "n" * 10_000, "t"],
        ["bbbbbbbb", "running", "3.00", "4", "bo", "short", "t"],
    ]
    lines = plain_lines(COLUMNS, rows)
    assert max(len(line) for line in (lines[0], lines[2])) < 200
    assert "n" * 10_000 in lines[1] and lines[2].startswith("bbbbbbbb") and lines[2].endswith("t")


def test_a_narrow_terminal_cuts_the_name_and_leaves_out_the_team_first() -> None:
    rows = [["aaaaaaaa", "succeeded", "12.34", "0.5", "alice", "yolo train data=coco.yaml " * 4, "platform-team"]]
    lines = table_lines(COLUMNS, rows, 50)
    assert lines[0].split() == ["ID", "STATUS", "COST", "KWH", "USER", "NAME"]
    assert lines[1].endswith(ELLIPSIS) and "alice" in lines[1] and len(lines[1]) == 50
    assert lines[2].startswith("not shown at this width: TEAM")


def test_a_text_column_empty_on_every_row_takes_no_room_on_a_terminal() -> None:
    rows = [["aaaaaaaa", "failed", "1.00", "2", "ana", "train", ""]]
    assert "TEAM" not in table_lines(COLUMNS, rows, 200)[0]
    assert "TEAM" in table_lines(COLUMNS, rows, None)[0]  # piped: the columns a script expects


def test_report_tables_keep_run_ids_whole_even_when_they_start_with_digits() -> None:
    from gpuledger.cli.report_fit import columns_of, grid_fitter

    table = [
        ["RANK", "RUN_ID", "USER", "TEAM", "STATUS", "GPU_MODELS", "ALLOC GPU-H", "COST", "FLAGS"],
        ["1", "03cgynfv", "root", "platform-infrastructure", "succeeded", "A100-80GB-SXM", "0.0223", "0.05", "mig"],
        ["2", "3q2861m5", "ana", "vision", "failed", "A100-80GB-SXM", "0.000882", "<0.01", ""],
    ]
    kinds = {c.header: c.kind for c in columns_of(table)}
    assert kinds["RUN_ID"] == "key" and kinds["COST"] == "number" and kinds["USER"] == "text"
    lines = grid_fitter(50)(table).splitlines()
    assert all(len(line) <= 50 for line in lines)
    assert lines[1].startswith("  1     03cgynfv  ") and lines[1].rstrip().endswith("0.05")
    assert "FLAGS" in lines[-1] or "FLAGS" in lines[-2]  # the row's note gives way first


def test_a_piped_chargeback_is_not_padded_to_a_10kb_team_name() -> None:
    from gpuledger.reports.cost.render import _plain_table

    table = [["TEAM", "RUNS", "COST"], ["t" * 10_000, "1", "5.00"], ["vision", "2", "7.50"]]
    lines = _plain_table(table).splitlines()
    assert "t" * 10_000 in lines[2] and lines[2].endswith("5.00")
    assert max(len(lines[0]), len(lines[1]), len(lines[3])) < 80 and lines[3].endswith("7.50")
