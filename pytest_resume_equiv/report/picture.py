"""A picture to draw, and the process that draws them.

What a plot shows is read from the signatures on the plugin's side (`plot.py`); drawing it is
matplotlib's work, done in a process of its own (`drawer.py`) so that it never holds the GIL
of the pytest process that waits on launches. `python -m pytest_resume_equiv.report.picture`
reads one picture per line (JSON) on stdin, draws each, writes a line for each one it could
not draw on stdout (a file), and leaves at an empty line or when stdin closes. It imports only the standard library and
matplotlib.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Line:
    points: tuple[tuple[float, float], ...]
    style: str
    label: str


@dataclass(frozen=True)
class Panel:
    title: str
    lines: tuple[Line, ...]
    mark: Optional[tuple[float, str]]
    """A vertical line at x, with its label (the split, the first difference)."""


@dataclass(frozen=True)
class Picture:
    """A figure to draw: one panel per series, stacked, sharing the x axis's meaning."""

    path: str
    panels: tuple[Panel, ...]
    xlabel: str
    panel_height: float

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Picture:
        data: dict[str, Any] = json.loads(text)
        panels = tuple(
            Panel(
                p["title"],
                tuple(
                    Line(tuple((x, y) for x, y in ln["points"]), ln["style"], ln["label"])
                    for ln in p["lines"]
                ),
                (p["mark"][0], p["mark"][1]) if p["mark"] is not None else None,
            )
            for p in data["panels"]
        )
        return cls(data["path"], panels, data["xlabel"], data["panel_height"])


def draw(picture: Picture) -> Optional[str]:
    """Draw and save `picture` (matplotlib's object API, no pyplot and its global figures);
    its path, or None without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(7, picture.panel_height * len(picture.panels)))
    axes = fig.subplots(len(picture.panels), 1, squeeze=False)
    for ax, panel in zip(axes[:, 0], picture.panels):
        for line in panel.lines:
            ax.plot(*zip(*line.points), line.style, label=line.label, markersize=4)
        if panel.mark is not None:
            ax.axvline(panel.mark[0], color="grey", linestyle=":", label=panel.mark[1])
        ax.set_title(panel.title, fontsize=9)
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel(picture.xlabel)
    fig.tight_layout()
    fig.savefig(picture.path, dpi=80)
    return picture.path


END = "\n"
"""The line that ends the drawing: EOF alone may never come (a child forked from pytest
holds the pipe's write end too)."""


def main() -> None:
    for text in sys.stdin:
        if text == END:
            return
        try:
            picture = Picture.from_json(text)
        except (ValueError, KeyError, TypeError) as exc:
            print(f"a picture that is not one: {exc}", flush=True)
            continue
        if not os.path.isdir(os.path.dirname(picture.path)):
            continue  # its run directory was not kept (a test that ended passing, xfail)
        try:
            if draw(picture) is None:
                print(f"{picture.path}: matplotlib cannot be imported here", flush=True)
        except Exception as exc:  # noqa: BLE001 - said to pytest, which warns
            print(f"{picture.path}: {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    main()
