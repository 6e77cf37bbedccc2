"""The diagnosis's documentation, generated from the registry so it cannot drift from the
code: the rules in time order (docs/diagnosis.md) and the table of bug classes with their fixes
(docs/bugs.md). `python scripts/diagnosis_docs.py` writes both; a unit test compares."""

from __future__ import annotations

from .fixes import CLASSES
from .registry import NOTES, RULES, stage
from .rules import Stage

ORDER = (
    Stage.CHECKPOINT,
    Stage.RESUME_POINT,
    Stage.STREAM,
    Stage.OBJECT,
    Stage.LEAD,
    Stage.STEP,
    Stage.HELD,
    Stage.NO_DIVERGENCE,
    Stage.SOURCE,
    Stage.TOPOLOGY,
    Stage.CRASH,
    Stage.FRESH_PROCESS,
    Stage.NOISE,
)
"""The stages in the order the diagnosis asks them (the checks' stages last)."""


def rules_markdown() -> str:
    """Per stage, its rules in the order they are asked: id, class, what it reads, the
    look-alikes it is asked after."""
    lines = []
    for n, of in enumerate(ORDER, 1):
        doc = " ".join((of.__doc__ or "").split()) if of.__doc__ != Stage.__doc__ else ""
        lines += [f"### {n}. {of.value}", ""]
        if doc:
            lines += [doc, ""]
        for rule in stage(of):
            after = [a for a in rule.after if a in {r.id for r in stage(of)}]
            tail = f" After: {', '.join(f'`{a}`' for a in after)}." if after else ""
            last = " Always answers: the stage's last word." if rule.always else ""
            over = f" Leads over: {', '.join(rule.over)}." if rule.over else ""
            lines.append(
                f"- `{rule.id}` ({_class_link(rule.bug_class)}): {rule.doc}{tail}{over}{last}"
            )
        lines.append("")
    lines += ["### Notes", ""]
    for note in NOTES:
        which = (
            f" Beside: {', '.join(note.classes)}."
            if note.classes
            else f" Beside every class but: {', '.join(note.unless)}."
            if note.unless
            else ""
        )
        doc = " ".join((note.say.__doc__ or "").split()) if note.say.__name__ != "<lambda>" else ""
        lines.append(f"- `{note.id}`:{' ' + doc if doc else ''}{which}")
    return "\n".join(lines).rstrip() + "\n"


def _class_link(name: str) -> str:
    return f"[{name}]({CLASSES[name].anchor})"


def classes_markdown() -> str:
    """One row per class: its fix (the template, `{...}` filled from the finding) and the
    rules that name it."""
    by_class: dict[str, list[str]] = {}
    for rule in RULES:
        by_class.setdefault(rule.bug_class, []).append(rule.id)
    lines = []
    for name in sorted(CLASSES, key=str.lower):
        bug = CLASSES[name]
        anchor = bug.anchor.split("#", 1)[1]
        rules = ", ".join(f"`{r}`" for r in by_class.get(name, [])) or "none"
        lines += [f'<a id="{anchor}"></a>**{name}**: named by {rules}.', ""]
        fixes = [("", bug.fix)] + sorted(bug.variants.items())
        for variant, fix in fixes:
            if fix:
                label = f" ({variant})" if variant else ""
                lines.append(f"- Fix{label}: {fix.replace('{{', '{').replace('}}', '}')}")
        if any(fix for _, fix in fixes):
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def replace_between(text: str, name: str, body: str) -> str:
    """`text` with what lies between its `<!-- name:start -->` and `<!-- name:end -->`
    markers replaced by `body`."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}{end}{tail}"
