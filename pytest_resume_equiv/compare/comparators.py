"""How a check compares two runs: one protocol, bound once to a test's rules.

- `Exact`: every recorded value and every audited stream bit for bit (the default);
- `Tolerant`: the same, with the numbers the test's tolerance (a profile, or rules) lets move;
- `Measured`: the numbers within the noise measured between runs that should be the same;
- `WithinEnvelope` (`envelope.py`): a run on another topology, held to the numeric noise measured
  between two uninterrupted runs, one on each topology.

The `ComparisonRules` are the test's settings that shape a comparison (steps, tolerance, ignore,
strict-latent), bound once from the test's settings, or offline from the judgement a resumed
run directory keeps (`judgement.py`), so the offline `compare` judges as the test did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol, Union

from ..signature import Signature
from . import facts
from .accounting import DataAccount, account
from .diff import Allowance, Comparison, compare_runs
from .envelope import compare_topology
from .noise import ROUNDING, NoiseFacts
from .tolerance import PROFILES, ComparisonRules, Tolerance

Run = dict[int, Signature]


@facts.fact("data")
@dataclass
class DataFacts:
    """Which samples the resumed run consumed against the uninterrupted run's (per id key):
    exact under every comparator."""

    accounts: list[DataAccount]

    def lines(self, label: str) -> list[str]:
        return [f"{label}: {item.text()}" for item in self.accounts if not item.exact]

    def summary(self, label: str) -> list[str]:
        return []

    def json_extra(self) -> dict[str, Any]:
        """Each account in words, for the JSON report's readers."""
        return {"text": [item.text() for item in self.accounts]}


class Comparator(Protocol):
    """Compares `run` with `reference` at every step after `split`, on every rank.
    `user_only` leaves out the automatic audit keys and `skip_steps` the first resumed steps
    (the teeth check compares what the user recorded after its mutation)."""

    name: str
    rules: ComparisonRules

    def compare(
        self,
        reference: Run,
        run: Run,
        split: int,
        skip_steps: int = 0,
        user_only: bool = False,
    ) -> Comparison: ...


def _ignored(rules: ComparisonRules, run: Run) -> tuple[str, ...]:
    """The test's `ignore=` and what the trainer itself left out (`track(ignore=True)`)."""
    return (*rules.ignore, *[name for sig in run.values() for name in sig.ignored])


class Exact:
    """Bit for bit: what a load copies and what a deterministic trainer computes."""

    name = "exact"

    def __init__(self, rules: ComparisonRules) -> None:
        self.rules = rules

    def tolerance(self, split: int) -> Union[Tolerance, Allowance]:
        """How far numbers may move in a comparison resumed at `split`."""
        return PROFILES["exact"]

    def compare(
        self,
        reference: Run,
        run: Run,
        split: int,
        skip_steps: int = 0,
        user_only: bool = False,
    ) -> Comparison:
        rules = self.rules
        cmp = compare_runs(
            reference,
            run,
            split,
            rules.steps,
            self.tolerance(split),
            user_only=user_only,
            skip_steps=skip_steps,
            ignore=_ignored(rules, run),
            strict_latent=rules.strict_latent,
        )
        if split and not user_only:
            cmp.facts.append(DataFacts(account(reference, run, split, rules.steps, rules.ignore)))
        cmp.how = self.how()
        return cmp

    def how(self) -> str:
        return ""


def data_accounts(cmp: Comparison, reference: Run, run: Run) -> list[DataAccount]:
    """The data accounting a comparison made (its `DataFacts`), or, for a comparison made
    without it (by `compare_runs` alone), the same accounting made once now."""
    made = next((f for f in cmp.facts if isinstance(f, DataFacts)), None)
    if made is not None:
        return made.accounts
    return account(reference, run, cmp.split, cmp.steps, cmp.ignored)


class Tolerant(Exact):
    """Exact, except for the numbers the test's tolerance lets move (`tolerance.py`)."""

    name = "tolerance"

    def tolerance(self, split: int) -> Union[Tolerance, Allowance]:
        return self.rules.tolerance

    def how(self) -> str:
        return (
            f"recorded numbers within tolerance {self.rules.tolerance.describe()}, watched "
            "tensors by their statistics within it; integers, strings, sample ids, RNG states "
            "and the resume point exactly"
        )


class WithinEnvelope:
    """A run on another topology: sample ids exact over the global batch, values equal on
    every rank within the noise between `other` (the uninterrupted run on the resumed
    topology) and the reference (`envelope.py`)."""

    name = "envelope"

    def __init__(self, rules: ComparisonRules, other: Run) -> None:
        self.rules = rules
        self.other = other

    def compare(
        self,
        reference: Run,
        run: Run,
        split: int,
        skip_steps: int = 0,
        user_only: bool = False,
    ) -> Comparison:
        rules = self.rules
        return compare_topology(
            reference, self.other, run, split, rules.steps, rules.tolerance.later, skip_steps
        )


NOISE_FACTOR = 4.0
"""How far beyond the measured noise a resumed run may go: the noise between two runs that
drift from step 1 (or from the split, for two resumed processes) bounds what rounding alone
can do; a restore bug moves values by orders of magnitude more."""


class Measured(Exact):
    """Exact where nothing was measured to drift; elsewhere within NOISE_FACTOR times the
    measured noise of that rank, key and step (`noise.py`), or within the test's tolerance
    when it gave one that the noise fits in. Integers, strings, RNG states and sample ids stay
    exact."""

    name = "measured noise"

    def __init__(self, rules: ComparisonRules, noise: NoiseFacts) -> None:
        super().__init__(rules)
        self.noise = noise

    def tolerance(self, split: int) -> Union[Tolerance, Allowance]:
        profile, noise = self.rules.tolerance, self.noise

        def allowance(rank: int, key: str, step: int) -> Optional[tuple[float, float]]:
            given = profile.for_key(key, step, split)
            if given is not None:
                return given
            # numbers within the noise at that rank, key and step (exact where it measured
            # none); a fingerprint by its statistics, since under noise its hash says nothing
            # A few runs sample the noise, they do not bound it: two of them may round alike
            # at one step, or in one key, and not in the next (a loss computed from weights
            # that drift). So a key may move by NOISE_FACTOR times the largest spread seen at
            # that rank and step, or by NOISE_FACTOR times its largest relative spread at any
            # step, and, once the runs drift at all, by rounding level.
            relative = NOISE_FACTOR * noise.relative.get(key, 0.0)
            if noise.noisy:
                relative = max(relative, ROUNDING)
            return relative, NOISE_FACTOR * noise.at(rank, key, step)

        return allowance

    def how(self) -> str:
        given = self.rules.tolerance
        within = f"tolerance {given.describe()} or " if not given.exact else ""
        return (
            f"numbers within {within}{NOISE_FACTOR:g}x the noise measured at that rank, key and "
            "step or its largest relative spread, and at rounding level once the runs drift; "
            "integers, strings, sample ids, RNG states and the resume point exactly"
        )


def comparator_for(rules: ComparisonRules) -> Comparator:
    """The comparator of a resume on the uninterrupted run's own topology."""
    return Tolerant(rules) if not rules.tolerance.exact else Exact(rules)
