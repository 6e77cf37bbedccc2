"""Every likely cause is filed under a class of the one table (diagnose/classes.py) and made in
one place (a rule of diagnose/, turned into a `Diagnosis` by `Rule.diagnosis`), so a rule, a
check that reacts to a class, the catalogue and the tests cannot drift apart."""

import ast
from pathlib import Path

import pytest_resume_equiv
from pytest_resume_equiv.diagnose import classes, fixes
from pytest_resume_equiv.diagnose.registry import RULES

PACKAGE = Path(pytest_resume_equiv.__file__).parent


def _calls(name):
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == name:
                yield f"{path.relative_to(PACKAGE)}:{node.lineno}", node


def test_a_diagnosis_is_made_by_a_rule_only():
    made = [where for where, _ in _calls("Diagnosis")]
    assert made and all(where.startswith("diagnose/rules.py:") for where in made), made


def test_no_bug_class_is_spelled_out_where_a_rule_is_declared():
    found = [(where, node.args[2]) for where, node in _calls("Rule") if len(node.args) > 2]
    assert len(found) > 40  # the scan sees the rules
    literal = [where for where, arg in found if isinstance(arg, (ast.Constant, ast.JoinedStr))]
    assert literal == [], f"bug classes spelled out instead of named from classes.py: {literal}"


def test_every_rule_files_its_cause_under_a_class_of_the_table():
    unknown = sorted({rule.id for rule in RULES if rule.bug_class not in fixes.CLASSES})
    assert unknown == []


def test_the_vocabulary_names_each_class_once():
    names = {k: v for k, v in vars(classes).items() if k.isupper() and isinstance(v, str)}
    names = {k: v for k, v in names.items() if k not in ("SKIP_EXACTLY",)}
    assert len(set(names.values())) == len(names), names
    assert classes.rng_stream("numpy") == "numpy RNG"
