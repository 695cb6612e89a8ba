"""pytest configuration for tests/python.

The binding tests skip when the smla package is not importable (a C++-only build). Where the
package is meant to be there (CTest with SMLA_BUILD_PYTHON, scripts/test, scripts/python-test set
SMLA_REQUIRE_PACKAGE=1), an import failure stops the run instead, so a broken build never passes
as "skipped".
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # smla_np.py, next to the tests

if os.environ.get("SMLA_REQUIRE_PACKAGE") == "1":
    try:
        import smla  # noqa: F401
    except ImportError as e:  # pragma: no cover - the failure this guards against
        pytest.exit(f"SMLA_REQUIRE_PACKAGE=1 but the smla package does not import: {e} "
                    f"(PYTHONPATH={os.environ.get('PYTHONPATH', '')!r})", returncode=1)
