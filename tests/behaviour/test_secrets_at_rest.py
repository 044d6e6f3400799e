"""Secrets never written in clear: every backend, serial and parallel engines, every channel.

A flow gets a ``Secret`` store value and a task's ``secret_args`` value, passes them around
(in results, in a ``repr``, JSON-escaped, inside containers), fails with them in its message and
reverts. Then everything written is scanned: the backend's records (raw files, SQLite pages,
PostgreSQL rows, and what the API reads back), log records, engine events, listener output,
``flowengine flows``/``show`` and the error raised. The secrets carry quotes, a backslash and a
non-ASCII letter, so each encoding differs; the scan looks for a core every encoding keeps.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from flowengine import engines, states, task
from flowengine import exceptions as exc
from flowengine.cli.main import cli
from flowengine.flows import linear_flow
from flowengine.listeners.logging import DynamicLoggingListener, LoggingListener
from flowengine.listeners.printing import PrintingListener
from flowengine.persistence import backends, base
from flowengine.secrets import Secret
from flowengine.types import notifier

#: Every encoding of each secret keeps its core (no quote, backslash or non-ASCII in it).
PASSWORD_CORE, TOKEN_CORE = "hunter2pw", "t0kenC0re"
PASSWORD = f"{PASSWORD_CORE}'q\"b\\Ω"
TOKEN = f"\"{TOKEN_CORE}'é"
CORES = (PASSWORD_CORE, TOKEN_CORE)
RAN: list[str] = []


class Login(task.Task):
    """Takes the token as a secret argument; returns both secrets in several encodings."""

    secret_args = ("token",)
    default_provides = "session"

    def execute(self, user: str, password: str, token: str) -> dict[str, Any]:
        RAN.append(self.name)
        return {"dsn": f"postgresql://{user}:{password}@db/app", "shown": repr(token),
                "json": json.dumps([password, token]), "pair": [password, token]}

    def revert(self, user: str, password: str, token: str, **kwargs: Any) -> None:
        logging.getLogger(__name__).info("undoing login (%d chars)", len(password))


class Use(task.Task):
    """Checks it got the clear values, then fails with them in every form."""

    def execute(self, session: dict[str, Any], password: str) -> None:
        RAN.append(self.name)
        assert session["pair"] == [password, TOKEN]  # the run itself sees clear values
        raise RuntimeError(f"cannot use {password!r} {json.dumps(session)} {session}",
                           password, session)


class Fine(task.Task):
    def execute(self, session: dict[str, Any]) -> str:
        RAN.append(self.name)
        return f"used {session['dsn']}"


def failing_flow() -> linear_flow.Flow:
    return linear_flow.Flow("secretive").add(Login("login"), Use("use"))


def fine_flow() -> linear_flow.Flow:
    return linear_flow.Flow("secretive").add(Login("login"), Fine("fine"))


def store_values() -> dict[str, Any]:
    return {"user": "ada", "password": Secret(PASSWORD), "token": TOKEN}


# ---- the backends, and everything they hold ------------------------------------------------


@pytest.fixture(params=["memory", "dir", "sqlite", "postgresql",
                        pytest.param("mariadb", marks=pytest.mark.cluster)])
def backend_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return "memory://"
    if request.param == "dir":
        return f"dir://{tmp_path}/records"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/records.db"
    if request.param == "mariadb":
        return str(request.getfixturevalue("mariadb_database_url"))
    return str(request.getfixturevalue("postgres_schema_url"))


@pytest.fixture
def backend(backend_uri: str) -> Iterator[base.Backend]:
    made = backends.fetch(backend_uri)
    with contextlib.closing(made.get_connection()) as conn:
        conn.upgrade()
    try:
        yield made
    finally:
        made.close()


def _records(made: base.Backend) -> str:
    """What the backend gives back, through the API."""
    conn = made.get_connection()
    parts = []
    for book in conn.get_logbooks():
        parts.append(json.dumps(book.to_dict(), default=repr))
        for fd in book:
            parts.append(json.dumps(fd.to_dict(), default=repr))
            parts += [json.dumps(ad.to_dict(), default=repr) for ad in fd]
    return "\n".join(parts)


def _raw(uri: str) -> str:
    """What the backend wrote, read underneath it (files, database pages, rows)."""
    if uri.startswith("dir://"):
        root = Path(uri[len("dir://"):])
        return "\n".join(p.read_bytes().decode("utf-8", "replace")
                         for p in root.rglob("*") if p.is_file())
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///"):]
        with contextlib.closing(sqlite3.connect(path)) as db:
            dump = "\n".join(db.iterdump())
        # Free pages keep what was overwritten: read the file itself too.
        raw = b"".join(p.read_bytes() for p in Path(path).parent.glob(Path(path).name + "*"))
        return dump + raw.decode("utf-8", "replace")
    if uri.startswith("postgresql"):
        import sqlalchemy as sa

        engine = sa.create_engine(uri.replace("postgresql://", "postgresql+psycopg://", 1))
        try:
            with engine.connect() as conn:
                tables = conn.execute(sa.text(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = current_schema()")).scalars().all()
                return "\n".join(str(row) for table in tables
                                 for row in conn.execute(sa.text(f'SELECT * FROM "{table}"')))
        finally:
            engine.dispose()
    return ""


def assert_no_secret(where: str, text: str) -> None:
    for core in CORES:
        assert core not in text, f"a secret is in clear in {where}: ...{_around(text, core)}..."


def _around(text: str, core: str) -> str:
    at = text.index(core)
    return text[max(0, at - 60):at + 60]


# ---- the channels a running engine writes to -------------------------------------------------


class Heard:
    """Every event the engine emits, and what the listeners print and log."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def attach(self, engine: Any) -> contextlib.ExitStack:
        def hear(state: str, details: dict[str, Any]) -> None:
            self.events.append(f"{state} {details!r} {details.get('result')}")

        engine.notifier.register(notifier.Notifier.ANY, hear)
        engine.atom_notifier.register(notifier.Notifier.ANY, hear)
        stack = contextlib.ExitStack()
        log = logging.getLogger("secrets-test")
        for listener in (LoggingListener(engine, log=log, level=logging.INFO),
                         DynamicLoggingListener(engine, log=log),
                         PrintingListener(engine)):
            stack.enter_context(listener)
        return stack


def _logged(caplog: pytest.LogCaptureFixture) -> str:
    formatter = logging.Formatter("%(name)s %(message)s")
    return "\n".join(formatter.format(r) + repr(r.__dict__) for r in caplog.records)


@pytest.mark.parametrize("engine_name", ["serial", "parallel"])
def test_no_secret_is_written_anywhere(
        backend: base.Backend, backend_uri: str, engine_name: str,
        caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    RAN.clear()
    engine = engines.load(failing_flow(), store=store_values(), backend=backend,
                          engine=engine_name)
    heard = Heard()
    with heard.attach(engine), pytest.raises(Exception) as raised:
        engine.run()
    assert RAN == ["login", "use"] and engine.storage.get_flow_state() == states.REVERTED
    assert_no_secret("the error raised", f"{raised.value} {raised.value!r} "
                                         f"{raised.getrepr(style='long')}")
    assert_no_secret("the events", "\n".join(heard.events))
    assert_no_secret("the log records", _logged(caplog))
    assert_no_secret("the listeners' output", "".join(capsys.readouterr()))
    assert_no_secret("the stored records", _records(backend))
    assert_no_secret("what the backend wrote", _raw(backend_uri))
    assert "***" in engine.storage.get_execute_failures()["use"].exception_str
    if backend_uri != "memory://":
        flow_id = engine.storage.flow_uuid
        runner = CliRunner()
        for args in (["flows", "--backend", backend_uri],
                     ["show", flow_id, "--backend", backend_uri, "--tracebacks", "--full"],
                     ["show", flow_id, "--backend", backend_uri, "--json"]):
            shown = runner.invoke(cli, args, catch_exceptions=False).output
            assert_no_secret(f"flowengine {args[0]}", shown)


def test_a_resumed_flow_asks_for_its_secret_inputs_again(
        backend: base.Backend, backend_uri: str) -> None:
    RAN.clear()
    first = engines.load(fine_flow(), store=store_values(), backend=backend)
    first.compile()
    first.prepare()  # stored, then "crashed" before running anything
    flow_id = first.storage.flow_uuid
    reader = backend if backend_uri == "memory://" else backends.fetch(backend_uri)
    try:
        stored = reader.get_connection().get_flow_details(flow_id)
        again = engines.load(fine_flow(), flow_detail=stored, backend=reader)
        with pytest.raises(exc.MissingSecrets) as missing:
            again.run()
        assert missing.value.missing_requirements == ["password", "token"]
        assert "--store password=VALUE --store token=VALUE" in str(missing.value)
        assert "store={name: Secret(value)}" in str(missing.value)
        assert RAN == []  # nothing ran without its secrets
        given = engines.load(fine_flow(), flow_detail=stored, backend=reader,
                             store={"password": PASSWORD, "token": TOKEN})
        given.run()
        assert RAN == ["login", "fine"]
        assert given.storage.fetch("session")["pair"] == [PASSWORD, TOKEN]
        assert given.storage.get_flow_state() == states.SUCCESS
        assert_no_secret("the stored records", _records(reader))
        assert_no_secret("what the backend wrote", _raw(backend_uri))
    finally:
        if reader is not backend:
            reader.close()


def _stored_meta_column(uri: str) -> list[str]:
    """The ``meta`` column of every row of the SQL backends' ``flowdetails`` table, as stored."""
    import sqlalchemy as sa

    url = uri.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [str(meta) for meta in
                    conn.execute(sa.text("SELECT meta FROM flowdetails")).scalars()]
    finally:
        engine.dispose()


def test_flow_metadata_is_stored_with_its_secrets_masked(
        backend: base.Backend, backend_uri: str) -> None:
    # doc/secrets.rst: "metadata written for the flow have each secret replaced by ***".
    RAN.clear()
    engine = engines.load(fine_flow(), store=store_values(), backend=backend)
    engine.compile()
    engine.prepare()
    engine.storage.update_flow_metadata({"note": f"deployed by ada with {PASSWORD}",
                                         "nested": {"why": [f"pw {PASSWORD!r}"]}})
    engine.run()
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert engine.storage.flow_meta["note"] == f"deployed by ada with {PASSWORD}", (
        "the running flow keeps the clear value; only what is written is masked")
    stored = backend.get_connection().get_flow_details(engine.storage.flow_uuid).meta
    assert stored["note"] == "deployed by ada with ***", stored
    assert_no_secret("the stored flow metadata", json.dumps(stored))
    if backend_uri.startswith(("sqlite", "postgresql")):
        [meta] = _stored_meta_column(backend_uri)
        assert_no_secret("flowdetails.meta", meta)
        assert "deployed by ada with ***" in meta, meta
    assert_no_secret("what the backend wrote", _raw(backend_uri))
