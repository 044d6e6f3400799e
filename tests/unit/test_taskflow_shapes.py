"""TaskFlow shapes that TaskFlow programs reach for: the memory tree, the dir file cache, names.

tests/conformance compares these with TaskFlow itself; these tests pin them without it.
"""

from __future__ import annotations

import contextlib

import pytest

from flowengine import engines, exceptions, retry, task
from flowengine.flows import linear_flow
from flowengine.persistence import backends
from flowengine.persistence.backends import impl_dir, impl_memory


class Step(task.Task):
    def execute(self) -> str:
        return self.name


def test_fake_filesystem_paths_values_links_and_deletes() -> None:
    fs = impl_memory.FakeFilesystem()
    fs.ensure_path("/d")
    fs.ensure_path("/a/b/c")
    fs["/a/b/c"] = {"v": 1}
    assert fs.ls("/") == ["d", "a"]
    assert fs.ls("/a", absolute=True) == ["/a/b"]
    assert fs.ls_r("/") == ["a", "d", "a/b", "a/b/c"]  # breadth first, last added first
    assert fs["/a/b/c"] == {"v": 1} and fs["/a/b"] is None
    fs.symlink("/a/b/c", "/d/link")
    assert fs["/d/link"] == {"v": 1}
    assert "(link to /a/b/c)" in fs.pformat()
    with pytest.raises(ValueError, match="^Can not delete '/a', it has 1 children"):
        fs.delete("/a")
    del fs["/a"]
    with pytest.raises(exceptions.NotFound, match="^Path '/d/link' not found|^Path '/a/b/c'"):
        fs["/d/link"]
    fs.symlink("/d", "/d")
    with pytest.raises(ValueError, match="^Recursive link following not allowed"):
        fs["/d"]
    with pytest.raises(ValueError):
        fs.normpath("relative/path")
    fs.clear()
    assert fs.ls("/") == []


def test_memory_backend_memory_is_the_records_as_a_tree() -> None:
    backend = impl_memory.MemoryBackend()
    assert backend.memory.pformat() == "/"  # nothing stored yet
    engine = engines.load(linear_flow.Flow("root").add(Step("a")), backend=backend)
    engine.run()
    fd_uuid = engine.storage.flow_detail.uuid
    assert backend.memory.ls("/") == ["books", "flow_details", "atom_details"]
    assert backend.memory[f"/flow_details/{fd_uuid}"]["state"] == "SUCCESS"
    (atom_uuid,) = [u for u in backend.memory.ls(f"/flow_details/{fd_uuid}")
                    if backend.memory[f"/atom_details/{u}"]["atom"]["name"] == "a"]
    linked = backend.memory[f"/flow_details/{fd_uuid}/{atom_uuid}"]
    assert linked["type"] == "TASK_DETAIL" and linked["atom"]["results"] == "a"
    assert engine.storage._flowdetail is engine.storage.flow_detail


def test_dir_backend_file_cache_is_bounded_and_never_stale(tmp_path) -> None:
    backend = impl_dir.DirBackend({"path": str(tmp_path), "max_cache_size": 2})
    engine = engines.load(linear_flow.Flow("root").add(Step("a"), Step("b"), Step("c")),
                          backend=backend)
    engine.run()
    fd_uuid = engine.storage.flow_detail.uuid
    with contextlib.closing(backend.get_connection()) as conn:
        assert {ad.name for ad in conn.get_flow_details(fd_uuid)} >= {"a", "b", "c"}
        assert backend.file_cache.currsize == 2
        # Another process (here, another backend object) changes a cached record.
        other = impl_dir.DirBackend({"path": str(tmp_path)})
        with contextlib.closing(other.get_connection()) as other_conn:
            changed = other_conn.get_flow_details(fd_uuid)
            changed.state = "REVERTED"
            other_conn.update_flow_details(changed)
        assert conn.get_flow_details(fd_uuid).state == "REVERTED"
    with pytest.raises(ValueError, match="^Maximum cache size must be greater than"):
        impl_dir.DirBackend({"path": str(tmp_path), "max_cache_size": 0})


@pytest.mark.parametrize("name", ["memory", "memory:", "memory://"])
def test_backend_names_taskflow_accepts(name: str) -> None:
    assert isinstance(backends.fetch({"connection": name}), impl_memory.MemoryBackend)


def test_for_each_tries_a_repeated_value_again() -> None:
    tried: list[int] = []

    class Fails(task.Task):
        def execute(self, x: int) -> None:
            tried.append(x)
            raise RuntimeError(f"fails with {x}")

    flow = linear_flow.Flow("f", retry.ForEach([3, 2, 3], "r", provides="x")).add(Fails("t"))
    with pytest.raises(RuntimeError):
        engines.run(flow)
    assert tried == [3, 2, 3]


def test_a_retry_is_refused_where_a_task_goes() -> None:
    flow = linear_flow.Flow("f").add(retry.AlwaysRevert("r"))
    with pytest.raises(TypeError, match="^Unknown object .* requested to compile"):
        engines.run(flow)


@pytest.mark.parametrize("option", ["defer_reverts", "never_resolve", "inject_transient"])
def test_none_engine_options_are_false_as_in_taskflow(option: str) -> None:
    engine = engines.load(linear_flow.Flow("f").add(Step("a")), **{option: None})
    assert engine.options == {option: None}  # as given
    engine.run()
