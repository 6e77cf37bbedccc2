"""Every likely cause is filed under a name from the one vocabulary (diagnose/classes.py), so a
rule, a check that reacts to a class and the catalogue cannot drift apart."""

import ast
from pathlib import Path

import pytest_resume_equiv
from pytest_resume_equiv.diagnose import classes

PACKAGE = Path(pytest_resume_equiv.__file__).parent


def _bug_class_arguments():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Diagnosis":
                arg = node.args[1] if len(node.args) >= 2 else None
                for keyword in node.keywords:
                    if keyword.arg == "bug_class":
                        arg = keyword.value
                yield f"{path.relative_to(PACKAGE)}:{node.lineno}", arg


def test_no_bug_class_is_spelled_out_where_a_cause_is_made():
    found = list(_bug_class_arguments())
    assert len(found) > 20  # the scan sees the rules
    literal = [where for where, arg in found if isinstance(arg, (ast.Constant, ast.JoinedStr))]
    assert literal == [], f"bug classes spelled out instead of named from classes.py: {literal}"


def test_the_vocabulary_names_each_class_once():
    names = {k: v for k, v in vars(classes).items() if k.isupper() and isinstance(v, str)}
    assert len(set(names.values())) == len(names), names
    assert classes.rng_stream("numpy") == "numpy RNG"
