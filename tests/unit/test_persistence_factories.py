"""Flow factories recorded in flow details: flowengine accepts and refuses what TaskFlow does.

Each case runs through ``taskflow.engines.helpers`` (installed in the test environment) and through
``flowengine.engines``, and the outcomes (the result, or the class of the error) must match.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import pytest
from taskflow.engines import helpers as tf_helpers

from flowengine import engines, states, task
from flowengine.flows import linear_flow
from flowengine.persistence import models
from flowengine.persistence.backends import impl_memory

HERE = __name__  # tests/unit is on sys.path: this module imports back by this name


class Step(task.Task):
    def execute(self) -> str:
        return self.name


def make_flow(name: str = "made") -> linear_flow.Flow:
    return linear_flow.Flow(name).add(Step("one"), Step("two"))


class FlowClass(linear_flow.Flow):
    """A Flow subclass: refused, because TaskFlow names a class by its metaclass (ABCMeta)."""

    def __init__(self, name: str = "by-class") -> None:
        super().__init__(name)
        self.add(Step("only"))


class PlainFactory:
    """A class of metaclass ``type``: named after itself, so accepted."""


class Holder:
    @staticmethod
    def static_factory() -> linear_flow.Flow:
        return make_flow()

    def method_factory(self) -> linear_flow.Flow:
        return make_flow()

    def __call__(self) -> linear_flow.Flow:
        return make_flow()


def _deleted() -> linear_flow.Flow:
    return make_flow()


renamed = _deleted
del _deleted


def _nested() -> Callable[[], linear_flow.Flow]:
    def inner() -> linear_flow.Flow:
        return make_flow()

    return inner


FACTORIES: dict[str, Any] = {
    "function": make_flow,
    "flow-subclass": FlowClass,
    "plain-class": PlainFactory,
    "import-path": f"{HERE}.make_flow",
    "renamed-then-deleted": renamed,
    "lambda": lambda: make_flow(),
    "nested-function": _nested(),
    "staticmethod": Holder.static_factory,
    "bound-method": Holder().method_factory,
    "callable-instance": Holder(),
    "partial": functools.partial(make_flow, "partial"),
    "path-missing-attribute": f"{HERE}.no_such_factory",
    "path-missing-module": "no_such_module_for_flowengine.make",
    "path-without-module": "make_flow",
    "path-to-nested-attribute": f"{HERE}.Holder.static_factory",
}


def _outcome(call: Callable[[], Any]) -> str:
    try:
        value = call()
    except Exception as err:
        return type(err).__name__
    return f"ok {value}"


@pytest.mark.parametrize("case", sorted(FACTORIES))
def test_save_factory_details_accepts_and_refuses_as_taskflow(case: str) -> None:
    factory = FACTORIES[case]

    def save(helpers: Any) -> Any:
        detail = models.FlowDetail("fd", "fd-uuid")
        helpers.save_factory_details(detail, factory, ["x"], {"k": 1})
        return detail.meta["factory"]

    expected, got = _outcome(lambda: save(tf_helpers)), _outcome(lambda: save(engines))
    assert got == expected
    # The cases differ: some are refused, and those are refused at save time.
    assert expected.split()[0] in ("ok", "ValueError", "ImportError")


def test_the_cases_cover_both_outcomes() -> None:
    outcomes = {_outcome(lambda f=f: tf_helpers.save_factory_details(  # type: ignore[misc]
        models.FlowDetail("fd", "u"), f, None, None)).split()[0] for f in FACTORIES.values()}
    assert outcomes == {"ok", "ValueError", "ImportError"}


def test_unimportable_factory_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=rf"{HERE}\._deleted"):
        engines.save_factory_details(models.FlowDetail("fd", "u"), renamed, None, None)
    with pytest.raises(ValueError, match="lambda"):
        engines.load_from_factory(lambda: make_flow())


def test_load_from_factory_takes_an_import_path() -> None:
    backend = impl_memory.MemoryBackend()
    book = models.LogBook("book")
    engine = engines.load_from_factory(f"{HERE}.make_flow", factory_kwargs={"name": "by-path"},
                                       book=book, backend=backend)
    engine.run()
    detail = engine.storage.flow_detail
    assert detail.name == "by-path" and detail.state == states.SUCCESS
    assert detail.meta["factory"] == {"name": f"{HERE}.make_flow", "args": [],
                                      "kwargs": {"name": "by-path"}}
    stored = backend.get_connection().get_flow_details(detail.uuid)
    assert stored.meta["factory"]["name"] == f"{HERE}.make_flow"
    assert [atom.name for atom in engines.flow_from_detail(stored)] == ["one", "two"]


def _detail(meta: Any) -> Any:
    return types.SimpleNamespace(name="fd", uuid="fd-uuid", meta=meta)


DETAILS: dict[str, Any] = {
    "saved": {"factory": {"name": f"{HERE}.make_flow", "args": ["again"], "kwargs": {}}},
    "no-meta": None,
    "no-factory": {"other": 1},
    "no-name": {"factory": {"args": []}},
    "missing-module": {"factory": {"name": "no_such_module_for_flowengine.make"}},
    "missing-attribute": {"factory": {"name": f"{HERE}.gone"}},
    "name-without-module": {"factory": {"name": "make_flow"}},
    "nested-attribute": {"factory": {"name": f"{HERE}.Holder.static_factory"}},
}


@pytest.mark.parametrize("case", sorted(DETAILS))
def test_flow_from_detail_fails_as_taskflow(case: str) -> None:
    def rebuild(helpers: Any) -> str:
        return str(helpers.flow_from_detail(_detail(DETAILS[case])).name)

    assert _outcome(lambda: rebuild(engines)) == _outcome(lambda: rebuild(tf_helpers))


def test_flow_from_detail_names_the_stored_factory() -> None:
    pattern = rf"^Could not import factory for flow fd fd-uuid.*{HERE}\.Holder\.static_factory"
    with pytest.raises(ImportError, match=pattern):
        engines.flow_from_detail(_detail(DETAILS["nested-attribute"]))
    assert engines.flow_from_detail(_detail(DETAILS["saved"])).name == "again"
