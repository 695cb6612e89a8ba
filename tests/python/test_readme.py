"""README.md's Python example runs as written on a machine without a GPU (issue #20): the block
after the marker comment, in a fresh interpreter with this one's environment."""

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("smla", reason="the smla package is not importable; run scripts/test or scripts/python-test")

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
MARKER = "<!-- tests/python/test_readme.py runs this block -->"


def readme_example():
    text = open(README, encoding="utf-8").read()
    assert MARKER in text, "README.md lost the marker of its tested Python example"
    m = re.search(re.escape(MARKER) + r"\s*```python\n(.*?)```", text, re.S)
    assert m, "no ```python block right after the marker"
    return m.group(1)


def test_readme_python_example_runs_on_the_cpu(tmp_path):
    code = readme_example()
    script = tmp_path / "readme_example.py"
    script.write_text(code)
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""  # as on a machine without a GPU
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 0, f"README example failed:\n{r.stdout}\n{r.stderr}"
    assert r.stdout.strip() == "(4, 16, 512) (4, 16)", r.stdout
