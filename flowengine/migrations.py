"""Resuming stored flows across code changes: their shape, and migrations.

A flow is stored with its *shape* (atoms, links, classes, versions). An engine resuming it with
code whose flow factory now yields another shape refuses with the difference
(:class:`FlowShapeChanged`, naming the atoms added, removed and changed) unless a migration is
registered for the flow:

>>> from flowengine import migrations
>>> migrations.register_migration("orders.flows.make_order_flow")  # doctest: +SKIP

``flowengine check --backend URI`` lists the stored flows the current code cannot resume. See
doc/coordination.rst ("Upgrades").
"""

from flowengine.engines.shapes import (
    META_SHAPE,
    FlowShapeChanged,
    Migration,
    ShapeChange,
    difference,
    register_migration,
    shape_of,
    unregister_migration,
)

__all__ = [
    # registering
    "register_migration", "unregister_migration", "Migration",
    # what changed
    "FlowShapeChanged", "ShapeChange", "difference", "shape_of", "META_SHAPE",
]
