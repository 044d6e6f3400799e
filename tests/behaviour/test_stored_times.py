"""Every engine stores when the flow and each atom entered each state, with no listener attached,
in the details' ``times`` (never in ``meta``, which stays what TaskFlow's engine writes)."""

from __future__ import annotations

import contextlib

from flowengine import states
from flowengine.flows import linear_flow as lf
from flowengine.persistence import backends, models

from . import tasks


def test_every_engine_stores_when_each_state_was_entered_outside_meta(engine_factory):
    backend = backends.fetch("memory://")
    flow = lf.Flow("root").add(tasks.Step("a"), tasks.Step("b"), tasks.Fail("boom"))
    engine = engine_factory(flow, backend=backend, book=models.LogBook("times"))
    with engine_factory.raises(tasks.Boom):
        engine.run()
    with contextlib.closing(backend.get_connection()) as conn:
        fd = conn.get_flow_details(engine.storage.flow_uuid)
    assert not [key for key in fd.meta if key.endswith("-timestamp")], fd.meta
    assert fd.times[states.RUNNING] <= fd.times[states.REVERTED]
    atoms = {ad.name: ad for ad in fd}
    for name in ("a", "b"):
        times = atoms[name].times
        assert (times[states.RUNNING] <= times[states.SUCCESS] <= times[states.REVERTING]
                <= times[states.REVERTED]), name
    assert atoms["a"].times[states.SUCCESS] <= atoms["b"].times[states.RUNNING]
    assert atoms["boom"].times[states.RUNNING] <= atoms["boom"].times[states.FAILURE]
    for ad in atoms.values():
        assert not [key for key in ad.meta if key.endswith("-timestamp")], ad.meta
