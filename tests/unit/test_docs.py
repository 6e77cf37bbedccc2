"""The documentation stays true: options tables match the code, the site builds strictly,
the changelog names this version, the CI recipes use the plugin as documented."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import pytest_resume_equiv
from pytest_resume_equiv.settings import OPTIONS

ROOT = Path(__file__).resolve().parents[2]


def _option_rows(path: Path) -> set[tuple[str, str, str]]:
    rows = set()
    for line in path.read_text().splitlines():
        cells = re.findall(r"`([^`]+)`", line)
        if line.startswith("| `--resume-equiv-") and len(cells) >= 3:
            rows.add(tuple(cells[:3]))
    return rows


@pytest.mark.parametrize("doc", ["README.md", "docs/reference/options.md"])
def test_options_tables_match_the_code(doc):
    expected = {(o.cli, o.ini, o.env) for o in OPTIONS.values()}
    assert _option_rows(ROOT / doc) == expected


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
