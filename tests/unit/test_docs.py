"""The documentation stays true: the options table matches the code and is in one place,
the in-process page is the one its script writes from the code, the site builds strictly, the
changelog names this version, the CI recipes use the plugin as documented."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pytest_resume_equiv
from pytest_resume_equiv.marker import MARKER_KEYWORDS
from pytest_resume_equiv.plugin import MARKER_DOC
from pytest_resume_equiv.settings import OPTIONS

ROOT = Path(__file__).resolve().parents[2]


def _option_rows(path: Path) -> set[tuple[str, str, str]]:
    rows = set()
    for line in path.read_text().splitlines():
        cells = re.findall(r"`([^`]+)`", line)
        if line.startswith("| `--resume-equiv-") and len(cells) >= 3:
            rows.add(tuple(cells[:3]))
    return rows


def test_options_table_matches_the_code():
    expected = {(o.cli, o.ini, o.env) for o in OPTIONS.values()}
    assert _option_rows(ROOT / "docs" / "reference" / "options.md") == expected


def test_options_table_is_in_one_place():
    """The README links to the reference; a second copy of the table drifts."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    holding = [p.relative_to(ROOT).as_posix() for p in pages if _option_rows(p)]
    assert holding == ["docs/reference/options.md"]


def test_in_process_page_is_generated_from_the_patches_table():
    """docs/reference/in-process.md is what scripts/in_process_doc.py writes from
    rank/patches.py's PATCHES (run the script after changing the table)."""
    path = ROOT / "scripts" / "in_process_doc.py"
    spec = importlib.util.spec_from_file_location("in_process_doc", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    page = ROOT / "docs" / "reference" / "in-process.md"
    assert page.read_text(encoding="utf-8") == script.render(), "run scripts/in_process_doc.py"


def test_marker_keywords_are_documented():
    """`pytest --markers` and the marker reference name every keyword the marker accepts."""
    reference = (ROOT / "docs" / "reference" / "marker.md").read_text()
    rows = set(re.findall(r"^\| `(\w+)` \|", reference, re.M))
    assert rows == set(MARKER_KEYWORDS)
    parameters = MARKER_DOC.split("(", 1)[1].split(")", 1)[0]
    named = set(re.findall(r"(?:^|,\s*)(\w+)", parameters))
    assert named == set(MARKER_KEYWORDS)


def test_docs_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="install the test extra: pip install -e '.[test]'")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "reference" / "options" / "index.html").exists()


def test_changelog_names_this_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    first = re.search(r"^## (\S+)", text, re.M)
    assert first and first.group(1) == pytest_resume_equiv.__version__


@pytest.mark.parametrize("workflow", ["gpu.yml", "npu.yml"])
def test_ci_recipes_run_the_plugin_and_require_the_device(workflow):
    text = (ROOT / "examples" / "ci" / workflow).read_text()
    assert "-p resume_equiv --resume-equiv-require-device" in text
    assert "--resume-equiv-report=" in text and "--junitxml=" in text
    assert "\t" not in text  # YAML forbids tabs
    if _yaml() is not None:
        data = _yaml().safe_load(text)
        assert data["jobs"]["resume-equiv"]["steps"]


def _yaml():
    try:
        import yaml
    except ImportError:
        return None
    return yaml


@pytest.mark.parametrize(
    "path, name", [("docs/diagnosis.md", "rules"), ("docs/bugs.md", "classes")]
)
def test_the_generated_diagnosis_docs_are_the_registrys(path, name):
    """docs/diagnosis.md's rules and docs/bugs.md's classes are generated from the rule
    registry (python scripts/diagnosis_docs.py): a rule changed without them fails here."""
    from pytest_resume_equiv.diagnose.docs import classes_markdown, replace_between, rules_markdown

    text = (ROOT / path).read_text()
    render = {"rules": rules_markdown, "classes": classes_markdown}[name]
    assert replace_between(text, name, render()) == text, "run: python scripts/diagnosis_docs.py"
