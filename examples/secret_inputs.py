"""Keep secrets out of stored records, logs and errors, and give them again on resume.

A deployment flow gets a database password (a ``store`` value wrapped in ``Secret``) and an API
token (an argument its task names in ``secret_args``). Its first run fails with both secrets in
the error message, ``!r``-formatted and JSON-encoded, and reverts. The script then shows what
was stored (every form of each secret masked, the values themselves never written), resumes the
flow with a new engine (refused: the secrets were not stored), and resumes it again with them.

Run: python examples/secret_inputs.py
"""

import json
import tempfile
from pathlib import Path
from typing import Any

from flowengine import engines, exceptions, task
from flowengine.flows import linear_flow
from flowengine.persistence import backends
from flowengine.secrets import Secret

DB_PASSWORD = "correct'horse\"battery"
API_TOKEN = "tok-8f2c91"
#: Whether the (simulated) API is down, as it is for the first run.
OUTAGE = [True]


class Connect(task.Task):
    """Opens a session with the database password and the API token."""

    secret_args = ("api_token",)
    default_provides = "session"

    def execute(self, db_password: str, api_token: str) -> dict[str, Any]:
        return {"dsn": f"postgresql://deploy:{db_password}@db/app", "token": api_token}


class Deploy(task.Task):
    """Deploys, or fails with the whole session in its message while the API is down."""

    def execute(self, session: dict[str, Any]) -> str:
        if OUTAGE[0]:
            raise ConnectionError(f"API down for {session!r} ({json.dumps(session)})")
        return f"deployed with {len(session['token'])}-character token"


def make_flow() -> linear_flow.Flow:
    return linear_flow.Flow("deploy").add(Connect("connect"), Deploy("deploy", provides="done"))


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        run_in(Path(folder))


def run_in(folder: Path) -> None:
    """Run the flow with a store in ``folder``, then look at what the store holds."""
    uri = f"sqlite:///{folder / 'flows.db'}"
    backend = backends.fetch(uri)
    backend.get_connection().upgrade()

    engine = engines.load(make_flow(), backend=backend,
                          store={"db_password": Secret(DB_PASSWORD), "api_token": API_TOKEN})
    try:
        engine.run()
    except Exception as err:
        print(f"first run failed: {err}")
    flow_id = engine.storage.flow_uuid

    # What a new process finds in the database.
    stored = backend.get_connection().get_flow_details(flow_id)
    print(f"stored secret inputs: {stored.meta['secret_inputs']}")
    failure = next(ad.failure for ad in stored if ad.name == "deploy")
    print(f"stored failure: {failure.exception_str}")
    written = (folder / "flows.db").read_bytes()
    print(f"password in the database file: {DB_PASSWORD.encode() in written}")
    print(f"token in the database file: {API_TOKEN.encode() in written}")

    OUTAGE[0] = False
    try:
        engines.load(make_flow(), flow_detail=stored, backend=backend).run()
    except exceptions.MissingSecrets as err:
        print(f"resume without them: MissingSecrets for {err.missing_requirements}")
    again = engines.load(make_flow(), flow_detail=stored, backend=backend,
                         store={"db_password": Secret(DB_PASSWORD), "api_token": API_TOKEN})
    again.run()
    print(f"resumed with them: {again.storage.get_flow_state()}, {again.storage.fetch('done')}")
    backend.close()


if __name__ == "__main__":
    main()
