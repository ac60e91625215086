"""Settings: defaults, access-time reads, validation."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_pgqueue.conf import SETTINGS, conf
from django_pgqueue.exceptions import ConfigurationError


def test_defaults_are_valid_and_documented():
    assert conf.problems() == []
    for spec in SETTINGS:
        assert spec.help
        if spec.name not in {"RETRY_BASE_SECONDS", "RETRY_MAX_SECONDS"}:  # tests override these
            assert getattr(conf, spec.name) == spec.default


def test_settings_are_read_at_access_time():
    assert conf.LEASE_SECONDS == 30.0
    with override_settings(PGQUEUE_LEASE_SECONDS=12):
        assert conf.LEASE_SECONDS == 12.0
    assert conf.LEASE_SECONDS == 30.0


def test_invalid_values_raise_naming_the_setting():
    with (
        override_settings(PGQUEUE_CONCURRENCY="ten"),
        pytest.raises(ConfigurationError, match="PGQUEUE_CONCURRENCY"),
    ):
        _ = conf.CONCURRENCY


def test_retention_can_be_disabled():
    with override_settings(PGQUEUE_RETENTION_SECONDS=None):
        assert conf.RETENTION_SECONDS is None
