"""Argument encoding (pure functions, no database)."""

from __future__ import annotations

import json

import pytest

from django_pgqueue.exceptions import InvalidArguments
from django_pgqueue.store.payload import encode_arguments, encode_result


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


def test_subclasses_of_json_types_are_stored_as_their_plain_form():
    class Name(str):
        pass

    class Ratio(float):
        pass

    assert encode_arguments([Name("x"), Ratio(0.5)], {Name("k"): Name("v")}, limit=100) == (
        '["x",0.5]',
        '{"k":"v"}',
    )


def test_wide_floats_are_written_so_that_jsonb_keeps_them_floats():
    args_json, _ = encode_arguments([1e20, -1.5e17, 1e15], {}, limit=10**6)
    assert args_json == "[100000000000000000000.0,-150000000000000000.0,1000000000000000.0]"
    assert json.loads(args_json) == [1e20, -1.5e17, 1e15]


def test_model_instances_get_a_hint():
    class FakeModel:
        _meta = object()

    with pytest.raises(InvalidArguments, match="primary key"):
        encode_arguments([FakeModel()], {}, limit=100)


def test_results_are_normalised_as_django_does():
    stored = encode_result({"ok": (1, 2), 3: b"caf\xc3\xa9", "wide": 1e20})
    assert stored.json == '{"ok":[1,2],"3":"café","wide":100000000000000000000.0}'
    assert stored.value == {"ok": [1, 2], 3: "café", "wide": 1e20}
    assert stored.problem is None


def test_a_result_that_cannot_be_stored_becomes_a_note():
    stored = encode_result({"ok": [1, {2, 3}]})
    assert (
        stored.problem == "return value['ok'][1]: set is not JSON-serializable; pass a sorted list"
    )
    assert stored.value == {
        "unstorable_result": {"type": "builtins.dict", "reason": stored.problem}
    }
    assert json.loads(stored.json) == stored.value
