"""Message authentication: HMAC-SHA256 signatures in headers, with a shared key.

With a key, engines sign the requests (and discovery, cancellations) they publish and workers
sign their replies and announcements; each side refuses whatever is unsigned, badly signed or
signed too long ago, before decoding it. Without a key a peer refuses *signed* messages, so a
fleet where only some hold the key fails loudly instead of half working. Signatures travel in
headers, never in the body: TaskFlow peers validate bodies against closed schemas.

Two checks apply with or without a key: an announcement cannot claim more free slots than
:data:`MAX_PLAUSIBLE_CAPACITY` (see :func:`clamp_capacity`), and a reply to a running attempt is
accepted only from the worker that said it runs it (see :func:`foreign_sender`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker.delivery import Delivery

LOG = logging.getLogger(__name__)

#: Environment variable holding the shared key (when no option names one).
ENV_KEY = "FLOWENGINE_SIGNING_KEY"
#: Header: ``v1:<hex HMAC-SHA256>`` over the body and the headers that matter.
HEADER_SIGNATURE = "x-flowengine-signature"
#: Header: UNIX time the message was signed at (checked against the replay window).
HEADER_SIGNED_AT = "x-flowengine-signed-at"
#: Seconds a signature stays valid either side of the receiver's clock. A request waiting
#: in its queue longer than this is refused when it is finally delivered.
DEFAULT_REPLAY_WINDOW = 900.0
#: Keys shorter than this are refused: they could be guessed.
MIN_KEY_BYTES = 16
#: The most free slots an announcement or reply may claim (a worker runs one task per
#: thread; more than this is a forgery or a mistake, and would draw every request to it).
MAX_PLAUSIBLE_CAPACITY = 256
#: Refusals are logged at most once per sender and reason in this many seconds.
LOG_PERIOD = 60.0

#: Refusal reasons (the dispatcher's ``reason=`` log field).
REASON_UNSIGNED = "unsigned"
REASON_BAD_SIGNATURE = "bad-signature"
REASON_STALE = "stale-signature"
REASON_UNEXPECTED = "unexpected-signature"
REASONS = frozenset({REASON_UNSIGNED, REASON_BAD_SIGNATURE, REASON_STALE, REASON_UNEXPECTED})

#: The headers signing adds.
SIGNATURE_HEADERS = frozenset({HEADER_SIGNATURE, HEADER_SIGNED_AT})

_VERSION = "v1"
_UNSIGNED_HEADERS = frozenset({HEADER_SIGNATURE, ext.HEADER_DELAY})
_MAX_SENDERS = 10_000


def load_key(signing_key: str | None = None, signing_key_file: str | None = None,
             environ: Mapping[str, str] | None = None) -> bytes | None:
    """The shared key from an option, a key file or :data:`ENV_KEY` (in that order).

    Raises:
        ValueError: Both options given, an unreadable or empty key file, or a key shorter
            than :data:`MIN_KEY_BYTES`; the message names the source, never the key.
    """
    if signing_key and signing_key_file:
        raise ValueError("Give 'signing_key' or 'signing_key_file', not both")
    if signing_key_file:
        try:
            with open(signing_key_file, encoding="utf-8") as stream:
                key, source = stream.read().strip(), f"signing key file {signing_key_file!r}"
        except OSError as err:
            raise ValueError(f"Cannot read signing key file {signing_key_file!r}: "
                             f"{err.strerror or err}") from None
        if not key:
            raise ValueError(f"Signing key file {signing_key_file!r} is empty")
    elif signing_key:
        key, source = signing_key, "option 'signing_key'"
    else:
        key, source = (os.environ if environ is None else environ).get(ENV_KEY, ""), ENV_KEY
        if not key:
            return None
    raw = key.encode("utf-8")
    if len(raw) < MIN_KEY_BYTES:
        raise ValueError(f"The signing key from {source} is too short ({len(raw)} bytes; "
                         f"at least {MIN_KEY_BYTES})")
    return raw


def _canonical(body: bytes | str, properties: Mapping[str, Any],
               headers: Mapping[str, Any]) -> bytes:
    if isinstance(body, str):
        body = body.encode("utf-8")
    signed = {name: value for name, value in headers.items()
              if name.startswith("x-flowengine-") and name not in _UNSIGNED_HEADERS}
    parts = {
        "body": hashlib.sha256(body).hexdigest(),
        "type": properties.get("type"),
        "reply_to": properties.get("reply_to"),
        "correlation_id": properties.get("correlation_id"),
        "headers": signed,
    }
    return json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str).encode("utf-8")


def sender(message: Delivery) -> str:
    """Who a message says it is from (worker id, else origin), capped for log lines."""
    headers = getattr(message, "headers", None) or {}
    who = headers.get(pr.HEADER_WORKER) or headers.get(pr.HEADER_ORIGIN) or "unknown sender"
    return str(who)[:64]


def clamp_capacity(headers: Any) -> None:
    """Cap the free slots a message claims at :data:`MAX_PLAUSIBLE_CAPACITY` (in place)."""
    value = headers.get(pr.HEADER_CAPACITY) if isinstance(headers, dict) else None
    if value is None:
        return
    if type(value) is not int or value < 0:
        headers.pop(pr.HEADER_CAPACITY, None)  # unusable: as if none was advertised
    elif value > MAX_PLAUSIBLE_CAPACITY:
        headers[pr.HEADER_CAPACITY] = MAX_PLAUSIBLE_CAPACITY


def foreign_sender(holder: tuple[str, str | None] | None, correlation_id: str,
                   headers: Mapping[str, Any], data: Mapping[str, Any]) -> str | None:
    """The sender of a reply to a running attempt when it is not the attempt's holder.

    Args:
        holder: ``(correlation id, worker id)`` of the RUNNING reply the attempt got, if any.

    Returns:
        Why the reply is refused (naming both identities), or None when the reply may be
        applied: no RUNNING reply yet, a holder with no identity (a TaskFlow worker), the
        holder itself, or a redelivery notice (which comes, by design, from the worker the
        broker handed it to).
    """
    if holder is None or holder[0] != correlation_id or not holder[1]:
        return None
    payload = data.get("data")
    if isinstance(payload, dict) and payload.get("event_type") == ext.EVENT_REDELIVERED:
        return None
    claimed = headers.get(pr.HEADER_WORKER)
    if claimed == holder[1]:
        return None
    return (f"the attempt runs on worker {holder[1]}; the reply claims "
            f"{str(claimed or 'no identity')[:64]}")


class Signing:
    """Signs outgoing and checks incoming messages with a shared key (or requires none).

    Args:
        key: The shared key; None: sign nothing and refuse signed messages.
        window: Seconds a signature stays valid (see :data:`DEFAULT_REPLAY_WINDOW`).
        clock: UNIX time (injectable for tests).
        monotonic: For the log rate limit (injectable for tests).
    """

    def __init__(self, key: bytes | None = None, window: float = DEFAULT_REPLAY_WINDOW,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._key, self._window = key, window
        self._clock, self._monotonic = clock, monotonic
        self._lock = threading.Lock()
        self._logged: dict[tuple[str, str], tuple[float, int]] = {}

    @classmethod
    def from_options(cls, signing_key: str | None = None,
                     signing_key_file: str | None = None) -> Signing:
        """A :class:`Signing` with the key :func:`load_key` finds (if any)."""
        return cls(load_key(signing_key, signing_key_file))

    @property
    def enabled(self) -> bool:
        """Whether a key is set."""
        return self._key is not None

    @property
    def window(self) -> float:
        """Seconds a signature stays valid either side of the receiver's clock."""
        return self._window

    def __repr__(self) -> str:
        return f"Signing({'key set' if self._key else 'no key'}, window={self._window}s)"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Signing) and other._key == self._key
                and other._window == self._window)

    def __hash__(self) -> int:
        return hash((self._key, self._window))

    def _digest(self, body: bytes | str, properties: Mapping[str, Any],
                headers: Mapping[str, Any]) -> str:
        assert self._key is not None
        mac = hmac.new(self._key, _canonical(body, properties, headers), hashlib.sha256)
        return f"{_VERSION}:{mac.hexdigest()}"

    def sign(self, body: bytes, properties: Mapping[str, Any],
             headers: Mapping[str, Any] | None) -> dict[str, Any]:
        """``headers`` plus the signature headers (unchanged without a key)."""
        signed = dict(headers or {})
        if self._key is not None:
            signed[HEADER_SIGNED_AT] = round(self._clock(), 3)
            signed[HEADER_SIGNATURE] = self._digest(body, properties, signed)
        return signed

    def check(self, message: Delivery) -> tuple[str, str] | None:
        """``(reason, detail)`` if ``message`` must be refused, else None; logs refusals.

        Also caps the capacity the message claims (see :func:`clamp_capacity`).
        """
        refusal = self._verdict(message)
        if refusal is None:
            clamp_capacity(message.headers)
        else:
            self.log_refusal(message, *refusal)
        return refusal

    def _verdict(self, message: Delivery) -> tuple[str, str] | None:
        headers = message.headers or {}
        signature = headers.get(HEADER_SIGNATURE)
        if self._key is None:
            if signature is None:
                return None
            return REASON_UNEXPECTED, ("its sender signs messages but this peer has no "
                                       "signing key: give every engine and worker the same "
                                       f"key ({ENV_KEY})")
        if signature is None:
            return REASON_UNSIGNED, ("this peer has a signing key and the message carries no "
                                     "signature: its sender has no key, or forged it")
        signed_at = headers.get(HEADER_SIGNED_AT)
        if not isinstance(signed_at, (int, float)) or isinstance(signed_at, bool):
            return REASON_BAD_SIGNATURE, f"no valid {HEADER_SIGNED_AT} header"
        skew = self._clock() - signed_at
        if abs(skew) > self._window:
            return REASON_STALE, (f"signed {skew:.0f}s from now, outside the {self._window:.0f}s "
                                  "replay window (a replay, a clock off, or queued too long)")
        expected = self._digest(message.raw_body, message.properties, headers)
        if not isinstance(signature, str) or not hmac.compare_digest(signature, expected):
            return REASON_BAD_SIGNATURE, ("the signature does not match: a different key, or a "
                                          "message altered or forged")
        return None

    def log_refusal(self, message: Delivery, reason: str, detail: str) -> None:
        """Log one refusal, at most once per sender and reason per :data:`LOG_PERIOD`."""
        who = sender(message)
        now = self._monotonic()
        with self._lock:
            last, since = self._logged.get((who, reason), (-LOG_PERIOD, 0))
            if now - last < LOG_PERIOD:
                self._logged[(who, reason)] = (last, since + 1)
                return
            if len(self._logged) >= _MAX_SENDERS:  # a flood of made-up senders
                self._logged.clear()
            self._logged[(who, reason)] = (now, 0)
        props = getattr(message, "properties", None) or {}
        LOG.warning("Refused %s message from %s: reason=%s %s (%d more refused from it since "
                    "the last line; next line in %.0fs at the earliest)", props.get("type"), who,
                    reason, detail, since, LOG_PERIOD)


REASON_WRONG_SENDER = "wrong-sender"
_IMPOSTORS = Signing()


def refuse_impostor(message: Delivery, detail: str) -> None:
    """Log (rate-limited) a reply ignored because :func:`foreign_sender` named its sender."""
    _IMPOSTORS.log_refusal(message, REASON_WRONG_SENDER, detail)
