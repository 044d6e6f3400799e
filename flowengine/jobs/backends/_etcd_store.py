"""The etcd requests the etcd jobboard makes, over an etcd3gw client, with errors it names.

etcd3gw's helpers drop the answer's revision and encode text as Latin-1, so reads and
transactions go through its ``post`` directly; leases use its :class:`etcd3gw.Lease`. A board URI
naming several members (``etcd://h1:2379,h2:2379,h3:2379/path``) gets :class:`MembersClient`,
which sends a request that cannot reach its member to the next one.
"""

from __future__ import annotations

import threading
import urllib.parse
from typing import Any

from flowengine import exceptions as exc

try:
    import etcd3gw
    import etcd3gw.exceptions as etcd_exc
    import requests
except ImportError as err:  # pragma: no cover - depends on the installed extras
    raise ImportError("The etcd jobboard needs the etcd3gw client: "
                      "pip install 'flowengine[etcd]'") from err

from flowengine.jobs.backends import _etcd_keys as keys

__all__ = ["CLIENT_CONF", "EtcdStore", "MembersClient", "make_client"]

#: Conf keys passed on to :class:`etcd3gw.Etcd3Client`, with their converters (TaskFlow's).
CLIENT_CONF = (("host", str), ("port", int), ("protocol", str), ("ca_cert", str),
               ("cert_key", str), ("cert_cert", str), ("timeout", float), ("api_path", str))
#: Seconds a request may take when the conf sets no ``timeout`` (etcd3gw's default waits forever).
DEFAULT_TIMEOUT = 10.0


def make_client(conf: dict[str, Any]) -> etcd3gw.Etcd3Client:
    """The etcd3gw client ``conf`` describes (``host``, ``port``, ``protocol``, TLS files,
    ``timeout``, ``api_path``; ``hosts``, a comma list of ``host:port``, for several members).

    Raises:
        ValueError: A member of ``hosts`` that is not ``host:port``.
    """
    kwargs: dict[str, Any] = {key: convert(conf[key]) for key, convert in CLIENT_CONF
                              if conf.get(key) is not None}
    kwargs.setdefault("timeout", DEFAULT_TIMEOUT)
    members = [member.strip() for member in str(conf.get("hosts") or "").split(",")
               if member.strip()]
    if len(members) > 1:
        kwargs.pop("host", None)
        kwargs.pop("port", None)
        return MembersClient([_member(text) for text in members], **kwargs)
    return etcd3gw.Etcd3Client(**kwargs)


def _member(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"An etcd member must be given as host:port, not {text!r}")
    return host.strip("[]"), int(port)


class MembersClient(etcd3gw.Etcd3Client):
    """An etcd3gw client over several members of one cluster.

    Requests go to one member; one that cannot reach it (refused, timed out: the member died or
    is cut off) is sent to the next member, and so on round the list once, and the member that
    answered is used from then on (the board's watch follows it on its next reconnect). Which
    member leads does not matter: every member forwards writes to the leader.

    Args:
        members: ``(host, port)`` of each member (kept as :attr:`endpoints`).
        **kwargs: As for :class:`etcd3gw.Etcd3Client` (``protocol``, TLS files, ``timeout``).
    """

    def __init__(self, members: list[tuple[str, int]], **kwargs: Any) -> None:
        host, port = members[0]
        super().__init__(host=host, port=port, **kwargs)
        self.endpoints = list(members)
        self._current = 0
        self._switch = threading.Lock()

    def post(self, url: str, *args: Any, json: Any = None, **kwargs: Any) -> Any:
        """POST ``url`` (made by :meth:`get_url`, for whichever member) to the current member,
        or to the next ones."""
        parts = urllib.parse.urlsplit(url)
        path = urllib.parse.urlunsplit(("", "", parts.path, parts.query, ""))
        for turn in range(len(self.endpoints)):
            current = self.base_url
            try:
                return super().post(current + path, *args, json=json, **kwargs)
            except (etcd_exc.ConnectionFailedError, etcd_exc.ConnectionTimeoutError):
                if turn == len(self.endpoints) - 1:
                    raise
                self._next_member(current)
        raise AssertionError("unreachable: the last member's failure is raised")

    def _discover_api_path(self) -> None:
        # The first request asks a member for the gateway's API path: any member will do.
        for turn in range(len(self.endpoints)):
            current = self.base_url
            try:
                super()._discover_api_path()
                return
            except (etcd_exc.ConnectionFailedError, etcd_exc.ConnectionTimeoutError):
                if turn == len(self.endpoints) - 1:
                    raise
                self._next_member(current)

    def _next_member(self, failed: str) -> None:
        with self._switch:
            if self.base_url != failed:  # another thread moved on already
                return
            self._current = (self._current + 1) % len(self.endpoints)
            self.host, self.port = self.endpoints[self._current]


class EtcdStore:
    """Ranges, transactions and leases on one etcd, each failure a JobFailure naming ``what``.

    Args:
        client: The etcd3gw client.
        board: The board's name (for errors).
    """

    def __init__(self, client: etcd3gw.Etcd3Client, board: str) -> None:
        self.client = client
        self._board = board

    def _post(self, path: str, body: dict[str, Any], what: str) -> dict[str, Any]:
        try:
            answer: dict[str, Any] = self.client.post(self.client.get_url(path), json=body)
        except (etcd_exc.Etcd3Exception, requests.RequestException) as err:
            detail = getattr(err, "detail_text", None) or err
            raise exc.JobFailure(f"Jobboard '{self._board}' could not {what} on etcd at"
                                 f" {self.client.host}:{self.client.port}: {detail}") from err
        return answer

    def range(self, prefix: str, what: str, exact: bool = False,
              keys_only: bool = False) -> tuple[list[keys.KV], int]:
        """The keys starting with ``prefix`` (only ``prefix`` itself if ``exact``; without
        their values if ``keys_only``), sorted by key, and the revision read at."""
        body: dict[str, Any] = {"key": keys.b64(prefix), "keys_only": keys_only}
        if not exact:
            body["range_end"] = keys.b64(keys.prefix_end(prefix))
        answer = self._post("/kv/range", body, what)
        found = [keys.KV.from_gateway(item) for item in answer.get("kvs") or ()]
        return sorted(found, key=lambda kv: kv.key), int(answer["header"]["revision"])

    def get(self, key: str, what: str) -> keys.KV | None:
        """One key (None if missing)."""
        found, _ = self.range(key, what, exact=True)
        return found[0] if found else None

    def txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]],
            what: str) -> bool:
        """Run ``success`` if every ``compare`` holds; whether it did."""
        return self.txn_at(compare, success, what) is not None

    def txn_at(self, compare: list[dict[str, Any]], success: list[dict[str, Any]],
               what: str) -> int | None:
        """Run ``success`` if every ``compare`` holds; the revision it wrote (None: it did not
        run)."""
        answer = self._post("/kv/txn", {"compare": compare, "success": success, "failure": []},
                            what)
        return int(answer["header"]["revision"]) if answer.get("succeeded") else None

    def grant(self, ttl: float, what: str) -> int:
        """A new lease of ``ttl`` seconds (whole seconds, rounded up); its id."""
        answer = self._post("/lease/grant", {"TTL": max(1, int(-(-ttl // 1))), "ID": 0}, what)
        return int(answer["ID"])

    def refresh(self, lease: int, what: str) -> int:
        """Renew ``lease``; the seconds it now has (<= 0: it had already expired)."""
        answer = self._post("/lease/keepalive", {"ID": lease}, what)
        return int((answer.get("result") or {}).get("TTL", -1))

    def time_to_live(self, lease: int, what: str) -> int:
        """Seconds ``lease`` has left (<= 0: expired)."""
        return int(self._post("/kv/lease/timetolive", {"ID": lease}, what).get("TTL", -1))

    def revoke(self, lease: int) -> None:
        """End ``lease`` now (its keys go), ignoring failures: it expires anyway."""
        try:
            self._post("/kv/lease/revoke", {"ID": lease}, f"revoke lease {lease}")
        except exc.JobFailure:
            pass

    def _next(self, counter: str, what: str) -> tuple[keys.KV | None, int]:
        """The counter's key-value (None if missing) and the number after its value."""
        current = self.get(counter, what)
        return current, int(current.value or b"0") + 1 if current is not None else 1

    def increment(self, counter: str, what: str) -> int:
        """Add one to the number at ``counter`` (missing: 0), retried while others change it;
        the new number."""
        while True:
            current, number = self._next(counter, what)
            if self.txn([keys.same(counter, current)], [keys.put(counter, str(number).encode())],
                        what):
                return number

    def put_numbered(self, root: str, posting: dict[str, Any], what: str,
                     also_if: list[dict[str, Any]], also: list[dict[str, Any]],
                     ) -> tuple[str, dict[str, Any], int]:
        """Store ``posting`` as ``<root>/job<N>.data`` under the next number of
        ``<root>/sequence`` (TaskFlow's counter), with ``also`` if ``also_if`` holds; retried
        while other posts take the number. The job's key, the posting as stored and the
        revision it was stored at.

        Raises:
            flowengine.exceptions.NotFound: If ``also_if`` stopped holding.
        """
        counter = f"{root}/sequence"
        while True:
            current, number = self._next(counter, what)
            key = f"{root}/job{number}"
            stored = dict(posting, sequence=number)
            revision = self.txn_at([keys.same(counter, current), *also_if],
                                   [keys.put(counter, str(number).encode()),
                                    keys.put(key + keys.DATA_POSTFIX, keys.encode(stored)),
                                    *also], what)
            if revision is not None:
                return key, stored, revision
            if also_if and not self.txn(also_if, [], what):
                raise exc.NotFound(f"Jobboard '{self._board}' could not {what}: it changed"
                                   f" meanwhile")
