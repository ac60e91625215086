"""Argument encoding (pure functions, no database)."""

from __future__ import annotations

import json

import pytest

from django_pgqueue.exceptions import InvalidArguments
from django_pgqueue.payload import encode_arguments, encode_result


def test_plain_json_round_trips_unchanged():
    args = [1, -2.5, "text ünï 🎉", True, None, [1, [2]], {"a": {"b": []}}, 10**30]
    kwargs = {"nested": {"list": [1, 2, {"x": None}]}}
    args_json, kwargs_json = encode_arguments(args, kwargs, limit=10**6)
    assert json.loads(args_json) == args
    assert json.loads(kwargs_json) == kwargs


def test_tuples_become_lists_as_in_django_tasks():
    args_json, _ = encode_arguments((1, (2, 3)), {}, limit=10**6)
    assert json.loads(args_json) == [1, [2, 3]]


def test_kwargs_must_be_a_mapping_and_args_a_sequence():
    with pytest.raises(InvalidArguments, match="kwargs"):
        encode_arguments([], [("a", 1)], limit=100)  # type: ignore[arg-type]
    with pytest.raises(InvalidArguments, match="args"):
        encode_arguments("abc", {}, limit=100)  # type: ignore[arg-type]


def test_subclasses_of_json_types_are_rejected():
    class Name(str):
        pass

    with pytest.raises(InvalidArguments, match="Name"):
        encode_arguments([Name("x")], {}, limit=100)


def test_model_instances_get_a_hint():
    class FakeModel:
        _meta = object()

    with pytest.raises(InvalidArguments, match="primary key"):
        encode_arguments([FakeModel()], {}, limit=100)


def test_results_are_checked_too():
    assert encode_result({"ok": [1, 2]}) == '{"ok":[1,2]}'
    with pytest.raises(InvalidArguments, match="return value"):
        encode_result({1, 2})
