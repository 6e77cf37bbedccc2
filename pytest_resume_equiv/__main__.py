"""Offline: compare or show kept run directories, with the same verdict and text as a test.

    python -m pytest_resume_equiv compare UNINTERRUPTED_RUN RESUMED_RUN [--split N] [--steps N]
        [--tolerance RULE ...] [--ignore PATTERN ...]
    python -m pytest_resume_equiv compare [--configurations] BASELINE_RUN VARIANT_RUN [--steps N]
    python -m pytest_resume_equiv show RUN [--all] [--steps A-B]
    python -m pytest_resume_equiv doctor [--device auto|cpu|cuda|npu|xpu] [--nproc N]
        [--json PATH] [--timeout SECONDS]

`compare` judges as the test did: a resumed run directory a test kept holds the judgement
that shaped its verdict (split, steps, tolerance, ignore, strict-latent, and for a resume on
another topology the uninterrupted run on that topology); `--split`, `--steps`, `--tolerance`
and `--ignore` override it. An `@equivalent` test's variant run directory holds its judgement
too (its steps, label and both configurations' names): compared with the baseline run it
gives that item's verdict and lines, `--configurations` or not; `--configurations` compares
any two runs of different configurations so.

Exit status: 0 equal (compare) or shown (show), 1 diverged, 2 bad input (not a run directory,
unreadable or unknown signature files, bad arguments). `doctor` (doctor/cli.py) checks this
machine for resume tests: 0 they can run, 1 something blocks them, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Optional

from .checks.equivalent import explained
from .checks.other_topology import judge_topology
from .checks.resume import ResumeLike, judge_resume
from .compare.comparators import comparator_for
from .compare.configurations import compare_configurations
from .compare.tolerance import ComparisonRules, Tolerance, ToleranceRule
from .diagnose import diagnose_configurations
from .doctor import cli as doctor
from .rank.layout import is_audit_key
from .report.replay import Judgement, JudgementError, read_judgement
from .signature import Signature, SignatureError, read_run, readable

EQUAL, DIVERGED, BAD_INPUT = 0, 1, 2
EQUIVALENT = "equivalent"
"""The check of an `@equivalent` item, as its judgement names it."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 already; keep the usage line
        self.print_usage(sys.stderr)
        self.exit(BAD_INPUT, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m pytest_resume_equiv", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    compare = sub.add_parser("compare", help="compare a resumed run with an uninterrupted one")
    compare.add_argument(
        "uninterrupted", help="run directory of the uninterrupted launch (or the baseline)"
    )
    compare.add_argument("resumed", help="run directory of the resumed launch (or the variant)")
    compare.add_argument(
        "--split", type=int, help="the step the resumed run started after (default: its header)"
    )
    compare.add_argument(
        "--steps",
        type=int,
        help="the last step (default: the test's, else the uninterrupted run's last)",
    )
    compare.add_argument(
        "--tolerance",
        action="append",
        metavar="[PATTERN=]RTOL,ATOL",
        help="compare keys matching PATTERN (default every key) within rtol/atol, e.g. "
        "loss=1e-6,0; repeat for several; replaces the test's tolerance",
    )
    compare.add_argument(
        "--ignore",
        action="append",
        metavar="PATTERN",
        help="leave audited keys or fields matching PATTERN out (repeat for several); "
        "replaces the test's ignore=",
    )
    compare.add_argument(
        "--configurations",
        action="store_true",
        help="the two runs are two configurations of one training (an @equivalent test's "
        "baseline and variant, any numbers of ranks): compare every optimizer step over the "
        "global batch",
    )
    show = sub.add_parser("show", help="print what every rank of a run recorded")
    show.add_argument("run", help="a run directory (it holds signatures/rank-*.jsonl)")
    show.add_argument("--all", action="store_true", help="also the automatic rng:/watch: keys")
    show.add_argument("--steps", help="only these steps, e.g. 3-5")
    doctor.add_parser(sub)
    return parser


def _split_of(resumed: dict[int, Signature]) -> Optional[int]:
    for sig in resumed.values():
        split = sig.header.get("split")
        if isinstance(split, int):
            return split
    for sig in resumed.values():
        if sig.steps:
            return min(step for step, _ in sig.steps) - 1
    return None


def _tolerance(rules: Optional[list[str]]) -> Optional[list[ToleranceRule]]:
    """`--tolerance` rules as the marker's tolerance= holds them (None: not given)."""
    if rules is None:
        return None
    parsed = []
    for text in rules:
        pattern, _, pair = text.rpartition("=")
        try:
            rtol, atol = (float(x) for x in pair.split(","))
        except ValueError:
            raise SignatureError(
                f"--tolerance {text!r}: expected [PATTERN=]RTOL,ATOL, e.g. loss=1e-6,0"
            ) from None
        parsed.append((pattern or "*", rtol, atol))
    return parsed


def _last_step(run: dict[int, Signature]) -> int:
    return max((step for sig in run.values() for step, _ in sig.steps), default=0)


def _judgement(run_dir: str) -> Optional[Judgement]:
    try:
        return read_judgement(run_dir)
    except JudgementError as exc:
        raise SignatureError(str(exc)) from None


def compare_configurations_of(
    args: argparse.Namespace,
    base: dict[int, Signature],
    variant: dict[int, Signature],
    kept: Optional[Judgement],
) -> int:
    """Two configurations of one training, every optimizer step over the global batch: as
    the `@equivalent` item that kept the variant's run judged it (its steps, label and
    names), else under the runs' own names over the baseline's steps."""
    if args.split is not None:
        raise SignatureError("--split: not taken when comparing configurations (nothing resumes)")
    kept = kept if kept is not None and kept.check == EQUIVALENT else None
    names = kept.names if kept is not None else {}
    found = compare_configurations(
        base,
        variant,
        args.steps or (kept.rules.steps if kept else _last_step(base)),
        (names.get("baseline", args.uninterrupted), names.get("variant", args.resumed)),
        *_configuration_rules(args, kept),
    )
    label = kept.label if kept else "compare"
    print("\n".join(explained(found, diagnose_configurations(found), label)))
    return EQUAL if found.equal else DIVERGED


def _configuration_rules(
    args: argparse.Namespace, kept: Optional[Judgement]
) -> tuple[Optional[Tolerance], tuple[str, ...]]:
    """The tolerance (None: the round-off bound) and the ignore= patterns two configurations
    are compared under: `--tolerance` and `--ignore` where given, else the test's (its
    marker's tolerance, unless exact: an `@equivalent` test's default is the round-off
    bound)."""
    rules = _tolerance(args.tolerance)
    if rules:
        tolerance: Optional[Tolerance] = Tolerance("custom", tuple(rules), tuple(rules))
    else:
        kept_tolerance = kept.rules.tolerance if kept is not None else None
        tolerance = kept_tolerance if kept_tolerance and not kept_tolerance.exact else None
    ignore = tuple(args.ignore) if args.ignore else (kept.rules.ignore if kept else ())
    return tolerance, ignore


def compare(args: argparse.Namespace) -> int:
    base = read_run(args.uninterrupted)
    res = read_run(args.resumed)
    kept = _judgement(args.resumed)
    if args.configurations or (kept is not None and kept.check == EQUIVALENT):
        return compare_configurations_of(args, base, res, kept)
    split = args.split if args.split is not None else kept.split if kept else _split_of(res)
    if split is None:
        print(f"error: cannot tell the split of {args.resumed}; pass --split", file=sys.stderr)
        return BAD_INPUT
    steps = args.steps or (kept.rules.steps if kept else _last_step(base))
    rules = kept.rules if kept else ComparisonRules(steps)
    rules = replace(rules, steps=steps).overridden(_tolerance(args.tolerance), args.ignore)
    label = kept.label if kept and args.split in (None, kept.split) else f"split {split}"
    envelope = (kept.runs.get("envelope") if kept else None) or ""
    if kept is not None and kept.check == "topology" and os.path.isdir(envelope):
        verdict = judge_topology(base, res, read_run(envelope), split, rules, label)
    else:
        check = kept.check if kept else "resume"
        verdict = judge_resume(base, res, split, comparator_for(rules), check, label)
    for line in ResumeLike.block(verdict, None, ""):
        print(line)
    return EQUAL if verdict.equal else DIVERGED


def _step_range(text: Optional[str]) -> tuple[int, int]:
    if not text:
        return (-(2**63), 2**63)
    low, _, high = text.partition("-")
    try:
        return int(low), int(high or low)
    except ValueError:
        raise SignatureError(f"--steps {text!r}: expected N or A-B, e.g. 3-5") from None


def show(args: argparse.Namespace) -> int:
    run = read_run(args.run)
    low, high = _step_range(args.steps)
    for rank, sig in sorted(run.items()):
        head = sig.header
        ending = "complete" if sig.complete else "no footer (the rank did not finish recording)"
        print(
            f"rank {rank} of {head.get('world_size')}: phase {head.get('phase')}, "
            f"split {head.get('split')}, {len(sig.steps)} steps recorded, {ending}; {sig.path}"
        )
        for step, values in sig.steps:
            if not low <= step <= high:
                continue
            keys = [k for k in values if args.all or not is_audit_key(k)]
            shown = ", ".join(f"{k}={readable(values[k])}" for k in keys)
            print(f"  step {step}: {shown}")
    return EQUAL


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "doctor":
        if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
            parser.error(f"--json {args.json}: its directory does not exist")
        return doctor.main(args)
    try:
        return compare(args) if args.command == "compare" else show(args)
    except SignatureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
