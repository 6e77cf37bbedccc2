"""Failure text and the run's summary, from the verdicts: each verdict renders itself
through its check (`checks.kind_of`); this module puts the parts in order and adds what
concerns the whole run (launch failures, run directories, the rerun line, the summary table).

Values are shown syrupy-style, `[- uninterrupted]` against `[+ resumed]`, with a step or two
of context instead of walls of numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..checks import kind_of
from ..checks.base import Outcome
from ..launch.rank_exits import failed_first
from ..launch.running import LaunchResult
from ..signature import count
from .records import TestRecord

NOT_EQUIVALENT = "resumed training is not equivalent to the uninterrupted run"


def format_outcome(outcome: Outcome, kept: str) -> str:
    """The failure text of a run that failed: what opens it (a check that explains the rest,
    or the plain fact), every failed resume's part, what was left out, where the runs are."""
    failed = outcome.failed
    resumes = [v for v in failed if v.primary]
    if not resumes:  # a check of the test itself failed (no teeth): its own text
        return "\n".join(line for v in failed for line in kind_of(v.check).block(v, outcome, kept))
    lines = [line for v in failed for line in kind_of(v.check).head(v, outcome)]
    lines = lines or [NOT_EQUIVALENT]
    for verdict in resumes:
        lines += kind_of(verdict.check).block(verdict, outcome, kept)
    if outcome.ignored:
        lines.append(f"ignored (not compared): {', '.join(outcome.ignored)}")
    if outcome.automatic:
        lines.append(f"recorded automatically: {', '.join(outcome.automatic)}")
    first = resumes[0]
    lines.append(f"run directories ({kept}):")
    # a golden-only run has no uninterrupted one; an equivalence test runs configurations
    for role in ("uninterrupted", "resumed", "baseline", "variant"):
        if first.runs.get(role):
            lines.append(f"  {role + ':':<14} {first.runs[role]}")
    judged = "variant" if first.runs.get("variant") else "resumed"
    lines.append(f"rerun the {judged} launch by hand:\n  {first.rerun}")
    return "\n".join(lines)


def format_plan_summary(outcome: Outcome) -> str:
    """What ran and what each check concluded, a line or a few each (the report section)."""
    lines = []
    for result in outcome.launches:
        status = (
            result.status.upper() if result.status in ("failed", "timed out") else result.status
        )
        status = f"{result.status} ({result.judged})" if result.judged else status
        reused = f" (reused: run for {result.reused})" if result.reused else ""
        lines.append(
            f"{result.spec.name}: {count(result.spec.world_size, 'rank')}, {result.duration:.1f}s, "
            f"{status}, {result.spec.run_dir}{reused}"
        )
    for verdict in [*outcome.verdicts, *[v for v in outcome.checks if not v.primary]]:
        lines += kind_of(verdict.check).headline(verdict)
    if outcome.ignored:
        lines.append(f"ignored (not compared): {', '.join(outcome.ignored)}")
    if outcome.automatic:
        lines.append(f"recorded automatically: {', '.join(outcome.automatic)}")
    lines += [f"warning: {text}" for text in outcome.warnings]
    return "\n".join(lines)


def outcome_failure(outcome: Outcome) -> str:
    """Why a run that was judged failed, in a few words (the summary table's last column)."""
    failed = outcome.failed
    return kind_of(failed[0].check).words(failed[0]) if failed else ""


def interrupted_failure(outcome: Outcome, stopped: Sequence[str]) -> str:
    """Why a run stopped by Ctrl-C or SIGTERM failed: what it had found before, when it had,
    and which launches were stopped (a determinism control, say, which could have measured
    the noise a trajectory's divergence is judged against)."""
    found = outcome_failure(outcome)
    if not found:
        return "interrupted"
    cut = f" ({', '.join(stopped)} stopped before its end)" if stopped else ""
    return f"interrupted after: {found}{cut}"


def _last_output(result: LaunchResult, rank: int, lines: int = 2) -> str:
    """A rank's last lines of stderr (or stdout when stderr is empty), on one line."""
    for stream in ("stderr", "stdout"):
        tail = result.tail(result.rank_log(rank, stream), lines).strip()
        if tail:
            return " | ".join(line.strip() for line in tail.splitlines())
    return ""


def format_launch_failure(result: LaunchResult, role: str) -> str:
    spec = result.spec
    if result.timed_out:
        head = f"the {role} launch ({spec.name}) timed out after {spec.timeout:g}s and was killed"
    else:
        head = f"the {role} launch ({spec.name}) failed"
    lines = [head + f" ({count(spec.world_size, 'rank')}, {result.duration:.1f}s):"]
    if result.problem:
        lines.append(f"  {result.problem}")
    bad = failed_first(result.ranks)
    for outcome in bad:
        lines.append(f"  rank {outcome.rank}: {outcome.detail or outcome.status}")
    for outcome in bad[:2]:
        for stream in ("stderr", "stdout"):
            path = result.rank_log(outcome.rank, stream)
            tail = result.tail(path).rstrip()
            if tail:
                lines.append(f"  --- last lines of rank {outcome.rank} {stream} ({path}) ---")
                lines += ["  " + line for line in tail.splitlines()]
                break
    others = [r for r in result.ranks if r not in bad[:2]]
    if bad and others:
        lines.append("  --- the other ranks' last lines ---")
        for outcome in others[:8]:
            tail = _last_output(result, outcome.rank)
            lines.append(f"  rank {outcome.rank} ({outcome.status}): {tail or '(no output)'}")
    if not bad:
        for path in result.agent_logs:
            tail = result.tail(path).rstrip()
            if tail:
                lines.append(f"  --- torchrun ({path}) ---")
                lines += ["  " + line for line in tail.splitlines()]
    lines.append(f"  run directory: {spec.run_dir}")
    lines.append(f"  rerun by hand: {result.command}")
    return "\n".join(lines)


def format_shutdown_deaths(results: list[LaunchResult]) -> str:
    """One sentence naming every rank that finished, closed its signature, then died."""
    deaths = [(r, d) for r in results for d in r.shutdown_deaths]
    if not deaths:
        return ""
    where = "; ".join(f"{r.spec.name} rank {d.rank}: {d.detail}" for r, d in deaths)
    return (
        f"{len(deaths)} rank(s) died during interpreter shutdown after their work was done and "
        f"recorded, so the comparison stands: {where} (stderr in each run directory's logs/)"
    )


def format_summary_table(records: list[TestRecord]) -> list[str]:
    """The end-of-session table: one row per resume test, in node-id order."""
    rows = [["test", "ranks", "splits", "launches", "wall", "verdict", "first divergence"]]
    for r in sorted(records, key=lambda r: r.test):
        reused = f" ({r.reused_launches} reused)" if r.reused_launches else ""
        rows.append(
            [
                r.test,
                r.ranks_text,
                ",".join(map(str, r.splits)),
                f"{r.launches}{reused}",
                f"{r.wall_seconds:.1f}s",
                r.verdict,
                _clip(r.first_divergence, 70),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def format_golden_summary(records: list[TestRecord], unused: list[str], removed: bool) -> list[str]:
    """What the session did with the golden store: the goldens it wrote, the tests that ran
    from a stored checkpoint only, the goldens no collected test uses."""
    lines = []
    for r in sorted(records, key=lambda r: r.test):
        for verdict in (v for run in r.runs for v in run.verdicts):
            if verdict.check == "golden" and verdict.why.startswith("update run"):
                lines.append(f"{r.test}: {verdict.why[len('update run: ') :]}")
            if verdict.check == "compat" and verdict.why.startswith("golden-only"):
                lines.append(f"{r.test}: golden-only: {verdict.label} {verdict.status}")
    if unused:
        how = (
            "removed (--resume-equiv-update-golden)"
            if removed
            else "not removed; an update run (--resume-equiv-update-golden) removes them"
        )
        lines.append(f"unused goldens ({len(unused)}, no collected test uses them), {how}:")
        lines += [f"  {test}" for test in unused]
    return lines
