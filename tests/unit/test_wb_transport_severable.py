"""The severable memory transport: a cut line is a dead process, as far as the broker goes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import kombu
import pytest

from flowengine.worker_based.broker import transport_memory as tm
from flowengine.worker_based.broker import transport_severable as ts


@pytest.fixture
def line() -> Iterator[str]:
    name = f"line-{uuid.uuid4().hex[:8]}"
    yield name
    ts.forget(name)


def on_line(line: str) -> kombu.Connection:
    return kombu.Connection("localhost", transport=ts.Transport,
                            transport_options={ts.LINE_OPTION: line})


def plain() -> kombu.Connection:
    return tm.guarded(kombu.Connection("localhost", transport="memory"))


def queue(name: str) -> kombu.Queue:
    return kombu.Queue(name, kombu.Exchange(name, type="direct"), routing_key=name)


def test_a_severed_line_gives_back_what_it_took_and_is_heard_no_more(line: str) -> None:
    work, replies = queue(f"work-{line}"), queue(f"replies-{line}")
    with on_line(line) as dying, plain() as broker:
        taken = work(dying.channel())
        taken.declare()
        replies(broker.channel()).declare()
        producer = kombu.Producer(broker.channel())
        producer.publish({"n": 1}, exchange=work.exchange, routing_key=work.routing_key)
        message = taken.get()  # taken, not acknowledged
        assert message is not None and message.payload == {"n": 1}

        assert ts.sever(line) == 1
        assert ts.severed(line)
        # It went back to its queue, marked redelivered, for anyone else to take.
        again = work(broker.channel()).get(no_ack=True)
        assert again is not None and again.payload == {"n": 1}
        assert again._raw["redelivered"]  # where the memory transport marks it (see delivery.py)
        # What the dead one publishes goes nowhere; what is sent to it, it never receives.
        kombu.Producer(dying.channel()).publish(
            {"late": True}, exchange=replies.exchange, routing_key=replies.routing_key)
        assert replies(broker.channel()).get(no_ack=True) is None
        producer.publish({"n": 2}, exchange=work.exchange, routing_key=work.routing_key)
        assert taken.get() is None
        assert work(broker.channel()).get(no_ack=True).payload == {"n": 2}


def test_other_lines_and_plain_connections_are_untouched(line: str) -> None:
    work = queue(f"work-{line}")
    with on_line(f"{line}-other") as alive, plain() as broker:
        work(broker.channel()).declare()
        ts.sever(line)
        kombu.Producer(alive.channel()).publish(
            {"alive": True}, exchange=work.exchange, routing_key=work.routing_key)
        assert work(broker.channel()).get(no_ack=True).payload == {"alive": True}
    ts.forget(f"{line}-other")
