"""Tables that fit the terminal. Id columns always keep their whole values; the flexible
columns (titles, directories, details) give up their width first, down to their minimum, then
the other columns (times, states) down to a few characters, then the flexible ones down to the
same; whatever is cut ends with an ellipsis. When even that does not fit (the ids alone are
wider than the terminal), the lines are wider than the terminal rather than cut an id. Output
to a pipe is never cut (its console is as wide as the longest line, ``api.cli.common``)."""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

#: Characters between two columns (``Table(box=None)``'s padding).
GAP = 2

#: The narrowest a column other than an id gets: a few characters and the ellipsis.
FLOOR = 3


def fit(avail: int, wants: list[int], mins: list[int]) -> list[int]:
    """Widths for flexible columns sharing ``avail`` characters: each gets what it wants
    when that fits, else an equal share of what is left (never under its minimum)."""
    widths = [min(w, m) for w, m in zip(wants, mins, strict=True)]
    open_ = [i for i in range(len(wants)) if wants[i] > widths[i]]
    left = avail - sum(widths)
    while open_ and left > 0:
        share = max(1, left // len(open_))
        done = [i for i in open_ if wants[i] - widths[i] <= share]
        for i in done or open_:
            give = min(wants[i] - widths[i], share, left)
            widths[i] += give
            left -= give
        open_ = [i for i in open_ if widths[i] < wants[i]]
    return widths


def plan(avail: int, wants: list[int], flexible: dict[int, int], ids: frozenset[int]) -> list[int]:
    """The width of each column, ``avail`` characters being left once the gaps are counted:
    ids get what they want; the flexible columns shrink first (to their minimum in
    ``flexible``), then the others (to ``FLOOR``), then the flexible ones again (to
    ``FLOOR``). The sum is over ``avail`` only when the columns at their floors are."""
    flex = sorted(flexible)
    firm = [i for i in range(len(wants)) if i not in flexible and i not in ids]
    widths = list(wants)
    floor = dict.fromkeys(flex + firm, FLOOR)
    for shrinking, mins in ((flex, flexible), (firm, floor), (flex, floor)):
        room = avail - sum(w for i, w in enumerate(widths) if i not in shrinking)
        shares = fit(room, [wants[i] for i in shrinking], [mins[i] for i in shrinking])
        for i, w in zip(shrinking, shares, strict=True):
            widths[i] = w
        if sum(shares) <= room:
            break
    return widths


def _tail(text: str, width: int) -> str:
    """``text`` in ``width`` cells, its start replaced by an ellipsis when it is longer."""
    if cell_len(text) <= width:
        return text
    start = 0
    while start < len(text) and cell_len(text[start:]) > width - 1:
        start += 1
    return "…" + text[start:]


def fitted(
    names: list[str],
    rows: list[list[str]],
    width: int,
    flexible: dict[int, int],
    *,
    ids: frozenset[int],
    cut_start: frozenset[int] = frozenset(),
) -> Table:
    """A table of ``rows`` under ``names`` in ``width`` characters if it can be (see
    ``plan``): the columns in ``ids`` are never cut, ``flexible`` maps the index of each
    column cut first to its minimum width; a column in ``cut_start`` (a directory: its last
    parts say the most) loses its start rather than its end. Print it with ``show``."""
    wants = [
        max([cell_len(name)] + [cell_len(row[i]) for row in rows]) for i, name in enumerate(names)
    ]
    widths = plan(width - GAP * (len(names) - 1), wants, flexible, ids)
    # An explicit width: rich lays the columns out as planned even when that is wider than
    # the terminal (it would otherwise shrink every column, ids too).
    table = Table(
        box=None,
        pad_edge=False,
        header_style="bold underline",
        width=sum(widths) + GAP * (len(names) - 1),
    )
    for name, w in zip(names, widths, strict=True):
        table.add_column(name, width=w, no_wrap=True, overflow="ellipsis")
    for row in rows:
        cells = list(row)
        for i in cut_start:
            cells[i] = _tail(cells[i], widths[i])
        table.add_row(*cells)
    return table


def show(console: Console, table: Table) -> None:
    """Print a ``fitted`` table: as it is laid out, lines wider than the terminal included
    (the terminal shows the rest on the next line) rather than cropped."""
    console.print(table, highlight=False, crop=False)
