"""Write docs/reference/in-process.md: what a rank changes in its own process, from the PATCHES
table of pytest_resume_equiv/rank/patches.py (tests/unit/test_docs.py checks that the committed
page is what this writes).

    python scripts/in_process_doc.py
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "reference", "in-process.md")

INTRO = """# In-process changes

A rank runs the training code unchanged, so it sees a restore, a save, a step or a random draw
only by patching what that code calls. This page lists every such change a rank launched by
the plugin makes to its own process, what it costs, and what turns it off. Outside a test run
(`import pytest_resume_equiv` in production code) nothing is patched: the
[in-rank calls](in-rank.md) are no-ops.

- **How**: `replaced` is an attribute set to a wrapper (the original is kept, reachable as
  `__wrapped__` for a function, and put back when the rank state is uninstalled);
  `torch hook` is one of torch's global hooks; `process` is the process's own state.
- **Cost**: what it adds to each call of what it patches.
- **Off with**: `always` means on in every launched rank;
  [automatic recording](options.md) can be turned off.

Not listed: what any launcher does to a process it starts (environment variables, arguments,
working directory), and the seeding of every global random stream (torch's CPU and device
streams, numpy's, Python's) from the launch's seed and the rank before the training code
runs, which the training's own seeding overrides.

Generated from `PATCHES` in `pytest_resume_equiv/rank/patches.py` by
`python scripts/in_process_doc.py`.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    """The page, from the table as the package holds it now."""
    sys.path.insert(0, ROOT)
    from pytest_resume_equiv.rank.patches import PATCHES

    lines = [
        INTRO,
        "| What | Owner | How | Cost | Off with |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in PATCHES:
        cells = [row.what, f"`{row.owner}`", row.how, row.cost, row.switch]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    with open(PAGE, "w", encoding="utf-8") as f:
        f.write(render())
    print(f"wrote {os.path.relpath(PAGE, ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
