"""Tests for flowengine.worker_based.broker.dispatcher: routing, refusals and their reason codes.

Messages are real ``kombu.Message`` objects (so decoding is kombu's); only the channel they would
be settled on is a recorder.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
from typing import Any

import pytest
from kombu.message import Message

from flowengine import exceptions as exc
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker.delivery import Delivery

JSON = dp.JSON_CONTENT_TYPE


class RecordingChannel:
    """Records how messages were settled."""

    no_ack_consumers = None

    def __init__(self) -> None:
        self.settled: list[tuple[str, Any]] = []

    def basic_ack(self, delivery_tag: Any, multiple: bool = False) -> None:
        self.settled.append(("ack", delivery_tag))

    def basic_reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        self.settled.append(("requeue" if requeue else "reject", delivery_tag))


def make_message(
    channel: RecordingChannel,
    body: Any = None,
    message_type: str | None = "REQUEST",
    content_type: str = JSON,
    raw: bytes | None = None,
) -> Message:
    properties = {} if message_type is None else {"type": message_type}
    data = raw if raw is not None else json.dumps({} if body is None else body).encode()
    return Message(
        body=data, delivery_tag="tag-1", content_type=content_type, content_encoding="utf-8",
        properties=properties, channel=channel, accept=[JSON],
    )  # fmt: skip


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, Delivery]] = []

    def __call__(self, data: Any, message: Delivery) -> None:
        self.calls.append((data, message))


@pytest.fixture
def channel() -> RecordingChannel:
    return RecordingChannel()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "reason=" in r.getMessage()]


def test_valid_message_is_acked_then_processed(channel: RecordingChannel) -> None:
    seen: list[Any] = []

    def handler(data: Any, message: Delivery) -> None:
        seen.append((data, list(channel.settled)))

    dispatcher = dp.TypeDispatcher({"REQUEST": dp.Handler(handler)})
    dispatcher.on_message(make_message(channel, {"a": 1}))
    assert seen == [({"a": 1}, [("ack", "tag-1")])]


def test_manual_ack_handler_settles_itself(channel: RecordingChannel, recorder: Recorder) -> None:
    dispatcher = dp.TypeDispatcher({"REQUEST": dp.Handler(recorder, manual_ack=True)})
    dispatcher.on_message(make_message(channel, {"a": 1}))
    assert len(recorder.calls) == 1 and channel.settled == []


def test_handlers_get_a_frozen_delivery_that_settles_through_the_dispatcher(
        channel: RecordingChannel, recorder: Recorder) -> None:
    settled: list[tuple[str, Any]] = []

    def settler(message: Any, action: str) -> None:
        settled.append((action, message.delivery_tag))
        dp.settle(message, action)

    dispatcher = dp.TypeDispatcher({"REQUEST": dp.Handler(recorder, manual_ack=True)},
                                   settler=settler)
    message = make_message(channel, {"a": 1})
    message.properties.update(correlation_id="c-1", reply_to="replies")
    message.headers["x-flowengine-worker"] = "w1"
    dispatcher.on_message(message)
    [(data, delivery)] = recorder.calls
    assert isinstance(delivery, Delivery) and not isinstance(delivery, Message)
    assert (data, delivery.body, delivery.type, delivery.correlation_id, delivery.reply_to) == (
        {"a": 1}, {"a": 1}, "REQUEST", "c-1", "replies")
    assert delivery.headers == {"x-flowengine-worker": "w1"}
    assert delivery.raw_body == b'{"a": 1}' and not delivery.redelivered
    with pytest.raises(dataclasses.FrozenInstanceError):
        delivery.body = {}  # type: ignore[misc]
    assert not delivery.acknowledged
    delivery.requeue()
    assert delivery.acknowledged
    assert settled == [("requeue", "tag-1")] and channel.settled == [("requeue", "tag-1")]


def test_a_delivery_built_by_hand_settles_nothing() -> None:
    delivery = Delivery(body={"a": 1}, properties={"type": "REQUEST"})
    delivery.ack()
    delivery.touch()
    assert not delivery.acknowledged and delivery.correlation_id == "" and delivery.reply_to == ""
    assert "REQUEST" in delivery.describe()


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"message_type": None}, "missing-type"),
        ({"message_type": "GOSSIP"}, "unknown-type"),
        ({"content_type": "application/x-python-serialize", "raw": pickle.dumps({"a": 1})},
         "content-type"),
        ({"raw": b'{"a": 1'}, "decode-error"),
        ({"raw": b"\xff\xfe not utf-8"}, "decode-error"),
        ({"raw": b"[" * 80 + b"]" * 80}, "too-deep"),
        ({"raw": b'"' + b"x" * 2000 + b'"'}, "too-large"),
    ],
)  # fmt: skip
def test_bad_messages_are_rejected_with_one_reasoned_line(
    channel: RecordingChannel,
    recorder: Recorder,
    caplog: pytest.LogCaptureFixture,
    kwargs: dict[str, Any],
    reason: str,
) -> None:
    dispatcher = dp.TypeDispatcher({"REQUEST": dp.Handler(recorder)}, max_body_bytes=1000)
    with caplog.at_level(logging.WARNING):
        dispatcher.on_message(make_message(channel, **kwargs))
    assert recorder.calls == []
    assert channel.settled == [("reject", "tag-1")]
    lines = refusals(caplog)
    assert len(lines) == 1 and f"reason={reason}" in lines[0]


def test_schema_violation_is_rejected(
    channel: RecordingChannel, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    def validator(data: Any) -> None:
        raise exc.InvalidFormat("Request message data not of the expected format: 'action'")

    dispatcher = dp.TypeDispatcher({"REQUEST": dp.Handler(recorder, validator)})
    with caplog.at_level(logging.WARNING):
        dispatcher.on_message(make_message(channel, {"a": 1}))
    assert recorder.calls == [] and channel.settled == [("reject", "tag-1")]
    assert "reason=invalid-format" in refusals(caplog)[0]


def test_requeue_filters_hand_messages_back(channel: RecordingChannel, recorder: Recorder) -> None:
    votes: list[Any] = []

    def stopping(data: Any, message: Delivery) -> bool:
        votes.append(data)
        return True

    dispatcher = dp.TypeDispatcher({"REQUEST": dp.Handler(recorder)}, requeue_filters=[stopping])
    dispatcher.on_message(make_message(channel, {"a": 1}))
    assert votes == [{"a": 1}] and recorder.calls == []
    assert channel.settled == [("requeue", "tag-1")]


def test_a_failing_requeue_filter_does_not_vote(
    channel: RecordingChannel, recorder: Recorder
) -> None:
    def broken(data: Any, message: Delivery) -> bool:
        raise RuntimeError("filter bug")

    dispatcher = dp.TypeDispatcher({"REQUEST": dp.Handler(recorder)}, requeue_filters=[broken])
    dispatcher.on_message(make_message(channel, {"a": 1}))
    assert len(recorder.calls) == 1 and channel.settled == [("ack", "tag-1")]


def test_handler_errors_never_escape(
    channel: RecordingChannel, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(data: Any, message: Delivery) -> None:
        raise RuntimeError("handler bug")

    dispatcher = dp.TypeDispatcher({"REQUEST": dp.Handler(broken, manual_ack=True)})
    with caplog.at_level(logging.WARNING):
        dispatcher.on_message(make_message(channel, {"a": 1}))
    assert channel.settled == [("reject", "tag-1")]
    assert "reason=handler-error" in refusals(caplog)[0]


def test_auto_acked_message_is_not_settled_twice(channel: RecordingChannel) -> None:
    def broken(data: Any, message: Delivery) -> None:
        raise RuntimeError("handler bug")

    dispatcher = dp.TypeDispatcher({"REQUEST": dp.Handler(broken)})
    dispatcher.on_message(make_message(channel, {"a": 1}))
    assert channel.settled == [("ack", "tag-1")]


def test_a_dispatcher_that_does_not_settle_only_handles_and_refuses(
    channel: RecordingChannel, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    # The broker settled these on delivery (a consumer without acknowledgements).
    dispatcher = dp.TypeDispatcher({"REQUEST": dp.Handler(recorder)}, settles=False,
                                   requeue_filters=[lambda _data, _message: True])
    dispatcher.on_message(make_message(channel, {"a": 1}))  # handled, though a filter votes
    with caplog.at_level(logging.WARNING):
        dispatcher.on_message(make_message(channel, message_type="GOSSIP"))
    assert [data for data, _ in recorder.calls] == [{"a": 1}]
    assert channel.settled == []
    assert "reason=unknown-type" in refusals(caplog)[0]


def test_kombu_decode_errors_are_refused(
    channel: RecordingChannel, caplog: pytest.LogCaptureFixture
) -> None:
    dispatcher = dp.TypeDispatcher({})
    with caplog.at_level(logging.WARNING):
        dispatcher.on_decode_error(make_message(channel), ValueError("bad compression"))
    assert channel.settled == [("reject", "tag-1")]
    assert "reason=decode-error" in refusals(caplog)[0]


def test_settling_a_dead_channel_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    class DeadChannel(RecordingChannel):
        def basic_ack(self, delivery_tag: Any, multiple: bool = False) -> None:
            raise ConnectionError("channel closed")

    message = make_message(DeadChannel(), {"a": 1})
    with caplog.at_level(logging.WARNING):
        dp.settle(message, "ack")
    assert "Could not ack" in caplog.text


def test_log_lines_name_the_message_but_not_its_body(
    channel: RecordingChannel, caplog: pytest.LogCaptureFixture
) -> None:
    dispatcher = dp.TypeDispatcher({})
    with caplog.at_level(logging.WARNING):
        dispatcher.on_message(make_message(channel, {"password": "hunter2"}, message_type="X"))
    assert "tag-1" in caplog.text and "hunter2" not in caplog.text
