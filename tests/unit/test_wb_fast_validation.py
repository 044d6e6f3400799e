"""The validation fast paths never accept a body the JSON schemas reject."""

from __future__ import annotations

import random
from typing import Any

import pytest

from flowengine.worker_based import protocol as pr

VALUES: list[Any] = [None, True, 0, 1.5, "", "RUNNING", "SUCCESS", "FAILURE", "EVENT", "BAD",
                     "execute", "revert", "x", [], [1, 0], {}, {"a": 1}]
KEYS = ["state", "data", "result", "event_type", "details", "task_cls", "task_name",
        "task_version", "action", "arguments", "failures", "extra"]


TEMPLATES: list[dict[str, Any]] = [
    {"state": "SUCCESS", "data": {"result": 1}},
    {"state": "RUNNING", "data": {}},
    {"state": "EVENT", "data": {"event_type": "update_progress", "details": {"progress": 0.5}}},
    {"task_cls": "m.C", "task_name": "c", "task_version": [1, 0], "action": "execute",
     "arguments": {"x": 1}},
    {"task_cls": "m.C", "task_name": "c", "task_version": "1.0", "action": "revert",
     "arguments": {}, "failures": {}},
]


def _mutate(rng: random.Random, value: Any) -> Any:
    if not isinstance(value, dict) or rng.random() < 0.2:
        return rng.choice(VALUES)
    body = dict(value)
    for _ in range(rng.randint(0, 2)):
        choice = rng.random()
        if choice < 0.4 and body:
            key = rng.choice(list(body))
            body[key] = _mutate(rng, body[key])
        elif choice < 0.7 and body:
            del body[rng.choice(list(body))]
        else:
            body[rng.choice(KEYS)] = rng.choice(VALUES)
    return body


def _random_body(rng: random.Random) -> Any:
    """Valid templates, mutated a little: near the fast paths' edges."""
    return _mutate(rng, rng.choice(TEMPLATES))


@pytest.mark.parametrize("seed", range(5))
def test_fast_paths_agree_with_the_schemas(seed: int) -> None:
    rng = random.Random(seed)
    accepted = 0
    for _ in range(4000):
        body = _random_body(rng)
        for fast, schema in ((pr._plain_response, pr._RESPONSE), (pr._plain_request, pr._REQUEST)):
            if fast(body):
                accepted += 1
                assert schema.is_valid(body), body
    # A few thousand random bodies must exercise the fast paths, or this test proves nothing.
    assert accepted > 0


def test_common_bodies_take_the_fast_path() -> None:
    assert pr._plain_response({"state": "SUCCESS", "data": {"result": [1]}})
    assert pr._plain_response({"state": "RUNNING", "data": {}})
    assert pr._plain_response({"state": "EVENT",
                               "data": {"event_type": "update_progress", "details": {}}})
    assert pr._plain_request({"task_cls": "m.C", "task_name": "c", "task_version": [1, 0],
                              "action": "execute", "arguments": {}})
    assert not pr._plain_response({"state": "SUCCESS", "data": {"result": 1, "other": 2}})
