"""The scripts a newcomer runs keep Python packages out of the system interpreter (issue #20):
no silent --break-system-packages fallback, a project-local virtual environment that git ignores,
and scripts/test printing pytest's own counts. Static checks of the scripts' text; CI runs the
scripts themselves."""

import os
import re

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def test_no_script_breaks_system_packages():
    for name in sorted(os.listdir(os.path.join(ROOT, "scripts"))):
        text = read(os.path.join("scripts", name)) if not name.endswith((".png", ".json")) else ""
        assert "break-system-packages" not in text, f"scripts/{name} installs into the system Python"


def test_setup_makes_a_project_local_venv_that_git_ignores():
    setup = read("scripts/setup")
    assert re.search(r"-m venv", setup), "scripts/setup does not create a virtual environment"
    assert "/.venv/" in read(".gitignore").splitlines(), ".venv/ is not ignored by git"


def test_scripts_test_runs_pytest_itself_for_its_counts():
    test = read("scripts/test")
    # CTest hides a passing test's output, so pytest runs outside it, after CTest
    assert re.search(r"ctest .*-E '\^python_tests\$'", test)
    assert re.search(r"-m pytest .*tests/python", test)
