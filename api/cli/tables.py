"""Tables that fit the terminal: fixed columns keep their whole values (ids, times), flexible
ones share what is left and are cut with an ellipsis. Output to a pipe is never cut (its
console is as wide as the longest line, ``api.cli.common``)."""

from __future__ import annotations

from rich.table import Table

#: Characters between two columns (``Table(box=None)``'s padding).
GAP = 2


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


def fitted(
    names: list[str],
    rows: list[list[str]],
    width: int,
    flexible: dict[int, int],
    cut_start: frozenset[int] = frozenset(),
) -> Table:
    """A table of ``rows`` under ``names`` in ``width`` characters. ``flexible`` maps the
    index of each column that may be cut to its minimum width; a column in ``cut_start``
    (a directory: its last parts say the most) loses its start rather than its end."""
    wants = [max([len(name)] + [len(row[i]) for row in rows]) for i, name in enumerate(names)]
    fixed = sum(w for i, w in enumerate(wants) if i not in flexible) + GAP * (len(names) - 1)
    order = sorted(flexible)
    shares = fit(width - fixed, [wants[i] for i in order], [flexible[i] for i in order])
    widths = list(wants)
    for i, w in zip(order, shares, strict=True):
        widths[i] = w
    table = Table(box=None, pad_edge=False, header_style="bold underline")
    for name, w in zip(names, widths, strict=True):
        table.add_column(name, width=w, no_wrap=True, overflow="ellipsis")
    for row in rows:
        cells = list(row)
        for i in cut_start:
            if len(cells[i]) > widths[i]:
                cells[i] = "…" + cells[i][len(cells[i]) - widths[i] + 1 :]
        table.add_row(*cells)
    return table
