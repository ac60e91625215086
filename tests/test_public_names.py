"""The names the docs tell users to import stay importable from where the docs say."""

from __future__ import annotations

import pytest

import django_pgqueue.manager
from django_pgqueue import runners, values

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("name", django_pgqueue.manager.__all__)
def test_every_name_the_manager_exports_is_the_one_its_module_defines(name):
    exported = getattr(django_pgqueue.manager, name)
    # The values and runners have modules of their own; the manager's names are theirs.
    home = {"django_pgqueue.values": values, "django_pgqueue.runners": runners}.get(
        exported.__module__, django_pgqueue.manager
    )
    assert getattr(home, name) is exported
    assert exported.__module__ in {
        "django_pgqueue.manager",
        "django_pgqueue.values",
        "django_pgqueue.runners",
    }


def test_the_documented_import_of_jobspec_still_works():
    # docs/howto/tasks.md: ``from django_pgqueue.manager import JobSpec``.
    from django_pgqueue.manager import JobSpec

    assert JobSpec is values.JobSpec
    assert JobSpec("tests.tasks.noop").queue == "default"
