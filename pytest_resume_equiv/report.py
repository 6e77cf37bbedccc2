"""Failure text: what diverged first, where, in readable values, and how to look further.

Values are shown syrupy-style, `[- uninterrupted]` against `[+ resumed]`, with a step or two
of context instead of walls of numbers.
"""

from __future__ import annotations

import os

from .compare import Comparison, first_difference
from .diagnose import Diagnosis
from .launch import LaunchResult
from .orchestrate import ResumeOutcome, SplitVerdict
from .records import TestRecord
from .values import count, readable


def verdict_label(verdict: SplitVerdict) -> str:
    """ "split 4", or in a chain which resume it is and whose checkpoint it loaded."""
    if not verdict.link:
        return f"split {verdict.split}"
    if verdict.link == 1:
        return f"chain link 1 (resumed from step {verdict.split} of the uninterrupted run)"
    return (
        f"chain link {verdict.link} (resumed from step {verdict.split}, from the checkpoint "
        f"chain link {verdict.link - 1} saved)"
    )


def chain_text(outcome: ResumeOutcome, broke: SplitVerdict) -> str:
    """Which link of a chain broke, and whether a resume from the uninterrupted run's own
    checkpoint at that step broke too: that separates a stale checkpoint written by the
    link before from a load path that fails from that step on."""
    links = [v for v in outcome.verdicts if v.link]
    held = [v.link for v in links if v.link < broke.link and v.comparison.equal]
    text = f"the chain broke at link {broke.link} of {len(links)} (resumed from step {broke.split})"
    if held:
        text += f"; link{'s' * (len(held) > 1)} {', '.join(map(str, held))} matched"
    direct = broke.direct
    if direct is None or broke.link == 1:
        return text
    before = broke.link - 1
    if direct.equal:
        return text + (
            f"; a resume from the uninterrupted run's checkpoint at step {broke.split} matches, "
            f"so the checkpoint chain link {before} saved after its own resume does not hold "
            "the state it trained with: the resumed run saves a stale object (a state dict "
            "taken before the load) or leaves something out of its save"
        )
    return text + (
        f"; a resume from the uninterrupted run's checkpoint at step {broke.split} diverges "
        f"too ({first_difference(direct)}): the load path fails from this step on, whoever "
        "saved the checkpoint"
    )


def format_comparison(cmp: Comparison, label: str = "") -> str:
    label = label or f"split {cmp.split}"
    if cmp.problems:
        lines = [f"{label}: the resumed run did not record the steps it should have:"]
        lines += [f"  {p.message}" for p in cmp.problems]
        return "\n".join(lines)
    div = cmp.divergence
    if div is None:
        ranks = f"all {cmp.world_size} ranks" if cmp.world_size > 1 else "its one rank"
        return f"{label}: equal on {ranks} over {cmp.compared_steps} steps"
    where = f"key {div.key!r}" + (f" at {div.path}" if div.path != div.key else "")
    on = f" (node {div.node})" if div.node else ""
    lines = [
        f"{label}: first divergence at step {div.step}, rank {div.rank}{on}, {where}: {div.detail}",
        f"  [- uninterrupted] {readable(div.expected)}",
        f"  [+ resumed]       {readable(div.actual)}",
    ]
    if len(cmp.context) > 1:
        lines.append(f"  {div.key!r} on rank {div.rank} around step {div.step}:")
        for step, a, b in cmp.context:
            if a == b:
                lines.append(f"      step {step}   {readable(a)}")
            else:
                lines.append(f"    - step {step}   {readable(a)}")
                lines.append(f"    + step {step}   {readable(b)}")
    per_rank = "; ".join(
        f"rank {r}: {', '.join(keys)}" for r, keys in sorted(cmp.divergent_keys.items())
    )
    if per_rank:
        lines.append(f"  keys that differ at step {div.step}: {per_rank}")
    return "\n".join(lines)


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
    # The ranks that failed on their own first, then those torchrun stopped because of them.
    bad = sorted(
        (r for r in result.ranks if not r.ok),
        key=lambda r: r.detail.startswith("stopped by torchrun"),
    )
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
        f"their signatures were closed, so the comparison stands: {where} (stderr in each run "
        "directory's logs/)"
    )


DETERMINISM_KNOBS = (
    "make training deterministic first: torch.use_deterministic_algorithms(True), "
    "CUBLAS_WORKSPACE_CONFIG=:4096:8, torch.backends.cuda.matmul.allow_tf32 = False, seed every "
    "rank and every dataloader worker (generator= / worker_init_fn), no unseeded randomness; "
    "or give tolerance= for keys whose kernels cannot be bitwise"
)
TEETH_ADVICE = (
    "give it some: keep dropout on (p > 0) in the trained model, record values that depend on "
    "random state (the sampled noise, timesteps, augmentation), or pass rng_mutation=False if "
    "the training really uses no randomness"
)


def format_diagnosis(diag: Diagnosis) -> list[str]:
    lines = [f"  likely cause ({diag.bug_class}): {diag.cause}"]
    lines += [f"  note: {note}" for note in diag.notes]
    return lines


def format_outcome(outcome: ResumeOutcome, kept: str) -> str:
    if outcome.resume_equal and outcome.teeth.status == "failed":
        check = outcome.teeth.comparison
        teeth = outcome.plan.teeth
        assert teeth is not None and check is not None
        after = check.split + 2
        return (
            "this test has no teeth: every RNG stream was mutated right after step "
            f"{check.split + 1} of a resumed run (launch {teeth.spec.name}), and the recorded values "
            f"at steps {after}-{check.steps} still matched the uninterrupted run on all "
            f"{check.world_size} ranks, so the signature does not depend on random state and this "
            f"test cannot catch RNG resume bugs; {TEETH_ADVICE}.\n"
            f"run directories ({kept}): {os.path.dirname(teeth.spec.run_dir)}"
        )
    failing = [v for v in outcome.verdicts if not v.comparison.equal]
    if outcome.nondeterministic is not None:
        cmp = outcome.nondeterministic
        div = cmp.divergence
        first = (
            f"first at step {div.step}, rank {div.rank}, key {div.key!r}: "
            f"{readable(div.expected)} vs {readable(div.actual)}"
            if div is not None
            else "; ".join(p.message for p in cmp.problems)
        )
        head = [
            "training is not deterministic even without a resume: a second uninterrupted run "
            f"differs from the first ({first}); the resume is not to blame.",
            f"  {DETERMINISM_KNOBS}.",
        ]
    else:
        head = ["resumed training is not equivalent to the uninterrupted run"]
    lines = list(head)
    if failing and failing[0].link:
        lines.append(chain_text(outcome, failing[0]))
    for verdict in failing:
        label = verdict_label(verdict)
        if verdict.topology is not None:
            lines += [f"{label}: {line.strip()}" for line in verdict.topology.lines()[:1]]
            lines += verdict.topology.lines()[1:]
        else:
            # which samples first: a different batch explains different values
            lines += [f"{label}: {a.text()}" for a in verdict.data if not a.exact]
        lines.append(format_comparison(verdict.comparison, label))
        div = verdict.comparison.divergence
        if verdict.values_match and div is not None:
            lines.append(
                f"  every value you recorded matches through step {verdict.comparison.steps}; "
                f"the audited {div.key} differs from step {div.step} on, so whatever draws "
                "from it or is computed from it later will differ"
            )
        if verdict.diagnosis is not None and outcome.nondeterministic is None:
            lines += format_diagnosis(verdict.diagnosis)
    if outcome.ignored:
        lines.append(f"ignored (not compared): {', '.join(outcome.ignored)}")
    first = failing[0]
    lines += [
        f"run directories ({kept}):",
        f"  uninterrupted: {first.uninterrupted.spec.run_dir}",
        f"  resumed:       {first.launch.spec.run_dir}",
        f"rerun the resumed launch by hand:\n  {first.launch.command}",
    ]
    return "\n".join(lines)


def format_plan_summary(outcome: ResumeOutcome) -> str:
    lines = []
    for result in outcome.launches:
        status = (
            result.status.upper() if result.status in ("failed", "timed out") else result.status
        )
        reused = f" (reused: run for {result.reused})" if result.reused else ""
        lines.append(
            f"{result.spec.name}: {count(result.spec.world_size, 'rank')}, {result.duration:.1f}s, "
            f"{status}, {result.spec.run_dir}{reused}"
        )
    for verdict in outcome.verdicts:
        if verdict.topology is not None:
            lines += [f"{verdict_label(verdict)}: {verdict.topology.lines()[0]}"]
            lines += verdict.topology.lines()[1:]
        else:
            first = format_comparison(verdict.comparison, verdict_label(verdict))
            lines.append(first.splitlines()[0])
    lines.append(teeth_text(outcome))
    control = control_text(outcome)
    if control:
        lines.append(control)
    if outcome.ignored:
        lines.append(f"ignored (not compared): {', '.join(outcome.ignored)}")
    lines += [f"warning: {text}" for text in outcome.warnings]
    return "\n".join(lines)


def outcome_failure(outcome: ResumeOutcome) -> str:
    """Why a run that was judged failed, in a few words (the summary table's last column)."""
    if outcome.resume_equal and outcome.teeth.status == "failed":
        return "no teeth: the recorded values matched with every RNG stream mutated"
    if outcome.nondeterministic is not None:
        return "not deterministic without a resume: " + first_difference(outcome.nondeterministic)
    for verdict in outcome.verdicts:
        if not verdict.comparison.equal:
            return f"{verdict_label(verdict)}: {first_difference(verdict.comparison)}"
    return ""


def teeth_text(outcome: ResumeOutcome) -> str:
    """What the teeth check did, in one line ("teeth check: skipped (why)")."""
    teeth = outcome.teeth
    status = "not run" if teeth.status == "planned" else teeth.status
    name = (
        f" ({outcome.plan.teeth.name})"
        if outcome.plan.teeth and status in ("passed", "failed")
        else ""
    )
    return f"teeth check {status}{name}" + (f": {teeth.why}" if teeth.why else "")


def control_text(outcome: ResumeOutcome) -> str:
    """What the determinism control found, when it ran ("" when it did not)."""
    controls = {p.name for p in outcome.plan.controls.values()}
    if not any(r.spec.name in controls for r in outcome.launches):
        return ""
    if outcome.nondeterministic is None:
        return "determinism control: a second uninterrupted run matched the first"
    return (
        "determinism control: a second uninterrupted run differs from the first: "
        + first_difference(outcome.nondeterministic)
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
