"""Write the generated parts of the diagnosis docs from the rule registry: "The rules, in time
order" in docs/diagnosis.md and the table of classes in docs/bugs.md (between their markers).

    python scripts/diagnosis_docs.py
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pytest_resume_equiv.diagnose.docs import (  # noqa: E402
    classes_markdown,
    replace_between,
    rules_markdown,
)

TARGETS = {
    os.path.join("docs", "diagnosis.md"): ("rules", rules_markdown),
    os.path.join("docs", "bugs.md"): ("classes", classes_markdown),
}


def main() -> None:
    for path, (name, render) in TARGETS.items():
        full = os.path.join(ROOT, path)
        with open(full) as f:
            text = f.read()
        with open(full, "w") as f:
            f.write(replace_between(text, name, render()))


if __name__ == "__main__":
    main()
