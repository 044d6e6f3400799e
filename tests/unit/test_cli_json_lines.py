"""Every ``--json`` output is JSON lines: one object per line (doc/operations.rst)."""

from __future__ import annotations

import json
import pathlib

from click.testing import CliRunner

from flowengine import engines, task
from flowengine.cli.main import cli
from flowengine.flows import linear_flow
from flowengine.persistence import models


class Step(task.Task):
    def execute(self) -> int:
        return 1


def _objects(output: str) -> list[dict[str, object]]:
    lines = output.splitlines()
    assert lines, "nothing printed"
    parsed = [json.loads(line) for line in lines]
    assert all(isinstance(item, dict) for item in parsed), output
    return parsed


def test_flows_and_show_print_json_lines(tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'flows.db'}"
    uuids = []
    for name in ("one", "two"):
        engine = engines.load(linear_flow.Flow(name).add(Step()), backend=url,
                              book=models.LogBook("json"))
        engine.run()
        uuids.append(engine.storage.flow_uuid)
    listed = CliRunner().invoke(cli, ["flows", "--json", "--backend", url])
    assert sorted(row["uuid"] for row in _objects(listed.stdout)) == sorted(uuids)
    shown = CliRunner().invoke(cli, ["show", uuids[0], "--json", "--backend", url])
    [flow] = _objects(shown.stdout)
    assert flow["flow"]["uuid"] == uuids[0]  # type: ignore[index]
