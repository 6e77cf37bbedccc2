"""The registry itself: every rule and note has its test rows (a fixture it fires on, a
look-alike it is told apart from), the order of each stage comes from the declared
look-alikes and refuses what it cannot order, a rule that always answers is asked last, and
every bug class is filed by some rule."""

import importlib
import pkgutil
import typing
from pathlib import Path

import pytest

from pytest_resume_equiv.diagnose import registry
from pytest_resume_equiv.diagnose.classes import STREAM_KINDS, rng_before_iterator
from pytest_resume_equiv.diagnose.fixes import CLASSES
from pytest_resume_equiv.diagnose.registry import NOTES, RULES, stage
from pytest_resume_equiv.diagnose.rules import (
    Finding,
    Rule,
    RuleOrderError,
    Stage,
    check_after,
    ordered,
)
from pytest_resume_equiv.rank.layout import DERIVED_FROM

from . import builders

TEST_MODULES = sorted(
    name
    for _, name, _ in pkgutil.iter_modules([str(Path(__file__).parent)])
    if name.startswith("test_") and name != Path(__file__).stem
)
for _name in TEST_MODULES:  # their decorators fill the coverage rows
    importlib.import_module(f"{__package__}.{_name}")

IDS = [rule.id for rule in RULES]
STAGES = [s for s in Stage if s is not Stage.NOTE]


def test_the_package_holds_a_test_module_per_stage():
    assert TEST_MODULES == [
        "test_checkpoint",
        "test_checks",
        "test_configurations",
        "test_crash",
        "test_data",
        "test_held",
        "test_notes",
        "test_objects",
        "test_preempt",
        "test_resume_point",
        "test_step",
        "test_streams",
    ]


def test_rule_ids_are_unique():
    assert len(IDS) == len(set(IDS)), sorted(i for i in IDS if IDS.count(i) > 1)


def test_every_rule_fires_on_a_fixture_of_its_own():
    missing = [i for i in IDS if i not in builders.FIRES]
    assert missing == [], f"rules without a positive row (@fires): {missing}"


def alone_and_always(rule: Rule) -> bool:
    """A rule that always answers and is the only rule of every stage that asks it: no
    look-alike can win over it, and it cannot stay silent."""
    return rule.always and all(stage(s) == [rule] for s in rule.stages)


def test_the_rules_with_no_possible_look_alike_are_these():
    assert sorted(r.id for r in RULES if alone_and_always(r)) == [
        "noise.beyond-measured-noise",
    ]


def test_every_rule_is_told_apart_from_a_look_alike():
    told = {rule for rule, _ in builders.LOOK_ALIKES}
    missing = [r.id for r in RULES if r.id not in told and not alone_and_always(r)]
    assert missing == [], f"rules without a look-alike row (@look_alike): {missing}"


def test_the_rows_name_rules_of_the_registry():
    named = set(builders.FIRES) | {r for row in builders.LOOK_ALIKES for r in row if r}
    assert sorted(named - set(IDS)) == []
    assert [row for row in builders.LOOK_ALIKES if row[0] == row[1]] == []


def test_every_note_has_a_test():
    notes = {note.id for note in NOTES}
    assert sorted(notes - builders.NOTED) == [], "notes without a test (@noted)"
    assert sorted(builders.NOTED - notes) == []


# The order of a stage


def fake(id, after=(), always=False, stages=(Stage.STEP,)):
    """A rule that finds whatever it is given."""
    return Rule(id, stages, "unknown", Finding, lambda f: id, tuple(after), always)


def test_the_order_follows_after_and_then_the_ids():
    rules = [fake("b"), fake("a", after=["c"]), fake("c"), fake("z", always=True)]
    assert [r.id for r in ordered(rules, Stage.STEP)] == ["b", "c", "a", "z"]


def test_a_cycle_among_after_cannot_be_ordered():
    rules = [fake("a", after=["b"]), fake("b", after=["c"]), fake("c", after=["a"]), fake("d")]
    with pytest.raises(RuleOrderError, match=r"a cycle among after= of \['a', 'b', 'c'\]"):
        ordered(rules, Stage.STEP)


def test_an_after_that_names_no_rule_of_its_stages_is_refused():
    """`ordered` leaves out look-alikes that are not rules of the stage it orders (a data rule
    is asked after the learning-rate rules in Stage.STEP, which Stage.HELD does not ask), so
    the ids themselves are checked by `check_after`, before any stage is ordered."""
    unknown = [fake("a", after=["no-such-rule"]), fake("b")]
    other_stage = [fake("a", after=["b"]), fake("b", stages=(Stage.HELD,))]
    for rules in (unknown, other_stage):
        with pytest.raises(RuleOrderError, match="a: after= names"):
            check_after(rules)
    assert [r.id for r in ordered(unknown, Stage.STEP)] == ["a", "b"]


def test_the_registry_checks_the_after_ids_before_it_orders_a_stage(monkeypatch):
    monkeypatch.setattr(registry, "RULES", (fake("a", after=["no-such-rule"]),))
    registry.stage.cache_clear()
    try:
        with pytest.raises(RuleOrderError):
            registry.stage(Stage.STEP)
    finally:
        registry.stage.cache_clear()


def input_of(rule: Rule) -> object:
    """What the rule's `find` reads (its parameter's annotation)."""
    hints = typing.get_type_hints(rule.find)
    (read,) = [hint for name, hint in hints.items() if name != "return"]
    return read


@pytest.mark.parametrize("of", STAGES, ids=[s.name for s in STAGES])
def test_a_rule_that_always_answers_is_the_last_a_stage_asks_of_its_input(of):
    """Nothing asked after a rule that always answers could ever fire."""
    rules = stage(of)
    for read in {input_of(r) for r in rules}:
        same = [r for r in rules if input_of(r) == read]
        always = [r.id for r in same if r.always]
        assert len(always) <= 1, (of, always)
        assert not always or same[-1].id == always[0], (of, [r.id for r in same])


@pytest.mark.parametrize("of", [Stage.STEP, Stage.HELD])
def test_the_step_stages_end_with_a_rule_that_always_answers(of):
    """diagnose() relies on it: a divergent step always gets a cause."""
    assert stage(of)[-1].always


# Bug classes

DEAD_CLASSES: set[str] = set()
"""Classes no rule files under (and nothing else names): to remove from classes.py."""


def test_every_bug_class_is_filed_by_some_rule():
    """Some classes are families, one per stream kind; `rng_before_iterator` is filed only
    for the streams a generator is re-derived from (`rank.layout.DERIVED_FROM`: a
    RandomSampler's generator, from the CPU RNG), so its other kinds are unused until an
    owner derives from them. A new parent there needs its own class filed, not "cpu"."""
    filed = {rule.bug_class for rule in RULES}
    parents = set(DERIVED_FROM.values())
    partly_unused = {rng_before_iterator(kind) for kind in STREAM_KINDS if kind not in parents}
    assert sorted(partly_unused) == [
        "numpy RNG before the iterator started",
        "python RNG before the iterator started",
    ]
    assert sorted(set(CLASSES) - filed - partly_unused - DEAD_CLASSES) == []
    assert filed & partly_unused == set()
    assert sorted(DEAD_CLASSES & filed) == []


def test_a_lead_leads_over_classes_that_resume_point_rules_file():
    at_resume_point = {
        rule.bug_class
        for s in (Stage.CHECKPOINT, Stage.RESUME_POINT, Stage.STREAM, Stage.OBJECT)
        for rule in stage(s)
    }
    for lead in stage(Stage.LEAD):
        assert lead.over and set(lead.over) <= at_resume_point, lead.id
