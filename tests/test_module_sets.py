"""Every test module is placed in exactly one of conftest's module sets (which decide
what the Django-version legs of ``.ci/run`` run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import DJANGO_SURFACE, SERVER_SIDE, check_module_sets

pytestmark = pytest.mark.timeout(30)


def _tree(tmp_path: Path, names: set[str]) -> Path:
    for name in names:
        (tmp_path / name).write_text("")
    return tmp_path


def test_the_real_tree_is_fully_placed():
    check_module_sets(Path(__file__).parent)


def test_a_new_module_in_neither_set_is_refused(tmp_path):
    tests = _tree(tmp_path, DJANGO_SURFACE | SERVER_SIDE | {"test_brand_new.py"})
    with pytest.raises(pytest.UsageError, match=r"in neither .*'test_brand_new.py'"):
        check_module_sets(tests)


def test_a_removed_module_still_listed_is_refused(tmp_path):
    gone = sorted(DJANGO_SURFACE)[0]
    tests = _tree(tmp_path, (DJANGO_SURFACE | SERVER_SIDE) - {gone})
    with pytest.raises(pytest.UsageError, match=rf"listed but missing: \['{gone}'\]"):
        check_module_sets(tests)
