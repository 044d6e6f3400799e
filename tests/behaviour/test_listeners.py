"""The listeners TaskFlow programs attach (capturing, printing, logging, timing) hear the same
story from every engine, remote tasks included."""

import logging

from flowengine.flows import linear_flow as lf
from flowengine.listeners import capturing, printing, timing
from flowengine.listeners import logging as logging_listeners

from . import tasks


def flat(values):
    """Captured ``(kind, state, details)`` as ``'name.k STATE(result)'``, as TaskFlow's tests do."""
    out = []
    for kind, state, details in values:
        entry = f"{details[kind + '_name']}.{kind[0]} {state}"
        if "result" in details:
            result = details["result"]
            entry += f"({getattr(result, 'exception_str', result)})"
        out.append(entry)
    return out


def atom_meta(engine, name):
    detail = engine.storage.flow_detail.find(engine.storage.get_atom_uuid(name))
    assert detail is not None
    return dict(detail.meta)


def test_capture_of_a_reverted_flow(engine_factory):
    engine = engine_factory(lf.Flow("f").add(tasks.Step("a"), tasks.Fail("boom")))
    with capturing.CaptureListener(engine) as capturer:
        with engine_factory.raises(tasks.Boom):
            engine.run()
    assert flat(capturer.values) == [
        "f.f RUNNING",
        "a.t RUNNING",
        "a.t SUCCESS(a)",
        "boom.t RUNNING",
        "boom.t FAILURE(boom failed)",
        "boom.t REVERTING",
        "boom.t REVERTED(boom undone)",
        "a.t REVERTING",
        "a.t REVERTED(a undone)",
        "f.f REVERTED",
    ]


def test_printing_listener_tells_each_transition(engine_factory, capsys):
    engine = engine_factory(lf.Flow("f").add(tasks.Step("a")))
    with printing.PrintingListener(engine):
        engine.run()
    a_uuid = engine.storage.get_atom_uuid("a")
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:3] == [
        f"{engine} has moved task 'a' ({a_uuid}) into state 'RUNNING' from state 'PENDING'",
        f"{engine} has moved task 'a' ({a_uuid}) into state 'SUCCESS' from state 'RUNNING'"
        " with result 'a' (failure=False)",
    ]
    assert len(lines) == 4 and "flow 'f'" in lines[0] and "'SUCCESS'" in lines[3]


def test_dynamic_logging_raises_the_level_of_failures(engine_factory, caplog):
    logger = logging.getLogger("behaviour.listeners")
    caplog.set_level(logging.DEBUG, logger=logger.name)
    engine = engine_factory(lf.Flow("f").add(tasks.Step("a"), tasks.Fail("boom")))
    with logging_listeners.DynamicLoggingListener(engine, log=logger):
        with engine_factory.raises(tasks.Boom):
            engine.run()
    mine = [r for r in caplog.records if r.name == logger.name]
    failed = [r for r in mine
              if "'boom'" in r.getMessage() and "into state 'FAILURE'" in r.getMessage()]
    assert [r.levelno for r in failed] == [logging.WARNING]
    routine = [r for r in mine if "'a'" in r.getMessage()
               and ("into state 'RUNNING'" in r.getMessage()
                    or "into state 'SUCCESS'" in r.getMessage())]
    assert [r.levelno for r in routine] == [logging.DEBUG, logging.DEBUG]


def test_durations_and_event_times_are_stored(engine_factory):
    engine = engine_factory(lf.Flow("f").add(tasks.Step("a"), tasks.Step("b")))
    with timing.DurationListener(engine), timing.EventTimeListener(engine):
        engine.run()
    for name in ("a", "b"):
        meta = atom_meta(engine, name)
        assert meta["duration"] >= 0
        assert meta["RUNNING-timestamp"] <= meta["SUCCESS-timestamp"]
    assert engine.storage.flow_meta["duration"] >= 0
