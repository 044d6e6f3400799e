"""Failure: an exception captured as data, able to cross process boundaries.

:class:`Failure` has TaskFlow's API and its version-1 dict format (``to_dict``/``from_dict``), which
is also the failure payload of the worker wire protocol, so failures flow both ways between
flowengine and TaskFlow peers.

A decoded failure is data only: its ``exc_type_names`` are strings matched by name in
:meth:`Failure.check`; nothing named in a payload is ever imported or instantiated. Re-raising a
decoded failure therefore raises :class:`~flowengine.exceptions.WrappedFailure`.
"""

from __future__ import annotations

import copy as copy_mod
import functools
import sys
import traceback as traceback_mod
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, ClassVar, NoReturn

from flowengine import exceptions as exc
from flowengine.secrets import Masker

__all__ = ["Failure"]

ExcInfo = tuple[type[BaseException], BaseException | None, TracebackType | None]

# A context chain of n exceptions encodes as 2**n - 1 dicts in the version-1 format (each cause
# repeats the rest of the chain), so the captured chain is bounded to keep payloads small.
_MAX_CAUSES = 8

_BUILTIN_MODULES = frozenset({"builtins", "exceptions"})


_SCHEMA: dict[str, Any] = {
    "$ref": "#/definitions/cause",
    "definitions": {
        "cause": {
            "type": "object",
            "properties": {
                "version": {"type": "integer", "minimum": 0},
                "exc_args": {"type": "array", "minItems": 0},
                "exception_str": {"type": "string"},
                "traceback_str": {"type": "string"},
                "exc_type_names": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                },
                "causes": {"type": "array", "items": {"$ref": "#/definitions/cause"}},
            },
            "required": ["exception_str", "traceback_str", "exc_type_names"],
            "additionalProperties": True,
        },
    },
}


@functools.cache
def _validator() -> Any:
    """The failure-dict validator, built once, on first use (jsonschema costs start-up time
    to programs that never decode a failure)."""
    import jsonschema

    base = jsonschema.validators.validator_for(_SCHEMA)
    # In-process dicts may hold tuples where JSON has arrays; accept both, as TaskFlow does.
    checker = base.TYPE_CHECKER.redefine(
        "array", lambda _checker, value: isinstance(value, (list, tuple))
    )
    validator_cls = jsonschema.validators.extend(base, type_checker=checker)
    return validator_cls(_SCHEMA)



def _type_name(cls: type) -> str:
    """Name a type the way TaskFlow does: bare for builtins, ``module.Name`` otherwise."""
    if cls.__module__ in _BUILTIN_MODULES:
        return cls.__name__
    return f"{cls.__module__}.{cls.__name__}"


def _type_names(exc_type: type[BaseException]) -> tuple[str, ...]:
    root: type[BaseException] = Exception if issubclass(exc_type, Exception) else BaseException
    return tuple(_type_name(cls) for cls in exc_type.__mro__ if issubclass(cls, root))


def _safe_str(value: BaseException | None) -> str:
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__} object>"


def _json_safe(value: Any, depth: int = 0) -> Any:
    """Return ``value`` if JSON can encode it as is, else the closest safe stand-in (its repr)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if depth < 32:
        if isinstance(value, (list, tuple)):
            return [_json_safe(item, depth + 1) for item in value]
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return {k: _json_safe(v, depth + 1) for k, v in value.items()}
    try:
        return repr(value)
    except Exception:
        return f"<unrepresentable {type(value).__name__} object>"


def _same_exc_info(a: ExcInfo | None, b: ExcInfo | None) -> bool:
    if a == b:
        return True
    if a is None or b is None:
        return False
    # A copy() holds a shallow copy of the exception, so compare what it shows, not identity.
    if a[0] is not b[0] or type(a[1]) is not type(b[1]):
        return False
    if str(a[1]) != str(b[1]) or repr(a[1]) != repr(b[1]):
        return False
    return a[2] == b[2] or traceback_mod.format_tb(a[2]) == traceback_mod.format_tb(b[2])


class Failure:
    """An immutable record of an exception: its type names, message, arguments, traceback, causes.

    ``Failure()`` inside an ``except`` block captures the exception being handled;
    ``Failure(exc_info)`` captures a ``sys.exc_info()`` tuple; keyword arguments
    (``exception_str``, ``traceback_str``, ``exc_type_names``, ``exc_args``, ``causes``) build one
    from data, as :meth:`from_dict` does.

    Args:
        exc_info: A ``(type, value, traceback)`` tuple; defaults to the exception being handled.
        **kwargs: The data fields, to build a failure without an exception object.

    Raises:
        ValueError: If ``exc_info`` does not have three elements.
        TypeError: If there is no exception to capture, or on an unknown or missing field.
    """

    #: Version of the dict format written by :meth:`to_dict`.
    DICT_VERSION: ClassVar[int] = 1

    #: Every ``exc_type_names`` list ends with one of these.
    BASE_EXCEPTIONS: ClassVar[tuple[str, str]] = ("BaseException", "Exception")

    #: JSON schema of the dict format.
    SCHEMA: ClassVar[dict[str, Any]] = _SCHEMA

    _FIELDS: ClassVar[frozenset[str]] = frozenset(
        {"exception_str", "traceback_str", "exc_type_names", "exc_args", "causes"}
    )

    def __init__(self, exc_info: Any = None, **kwargs: Any) -> None:
        self._causes: tuple[Failure, ...] | None
        if kwargs:
            self._init_from_fields(exc_info, kwargs)
            return
        if exc_info is None:
            exc_info = sys.exc_info()
        elif len(exc_info) != 3:
            raise ValueError(f"Failure exc_info must have three elements, got {len(exc_info)}")
        exc_type, value, tb = exc_info
        if not (isinstance(exc_type, type) and issubclass(exc_type, Exception)):
            # As in TaskFlow: SystemExit, KeyboardInterrupt and the like are not failures of a
            # task; they stop the program.
            raise TypeError(f"Invalid exception type '{exc_type}' ({type(exc_type)}): a Failure "
                            f"captures Exception subclasses only")
        self._exc_info: ExcInfo | None = (exc_type, value, tb)
        self._exc_args: tuple[Any, ...] = tuple(getattr(value, "args", ()))
        self._exc_type_names = _type_names(exc_type)
        self._exception_str = _safe_str(value)
        self._traceback_str: str | None = "".join(traceback_mod.format_tb(tb))
        self._causes = None

    def _init_from_fields(self, exc_info: Any, fields: dict[str, Any]) -> None:
        unknown = set(fields) - self._FIELDS
        if unknown:
            raise TypeError(f"Failure.__init__ got unexpected keyword argument(s): "
                            f"{', '.join(sorted(unknown))}")
        if "exception_str" not in fields:
            raise TypeError("Failure built from fields needs 'exception_str'")
        self._exc_info = tuple(exc_info) if exc_info is not None else None  # type: ignore[assignment]
        self._exception_str = fields["exception_str"]
        self._traceback_str = fields.get("traceback_str")
        self._exc_type_names = tuple(fields.get("exc_type_names", ()))
        self._exc_args = tuple(fields.get("exc_args", ()))
        causes = fields.get("causes")
        self._causes = tuple(causes) if causes is not None else None

    @classmethod
    def from_exception(cls, exception: BaseException) -> Failure:
        """Capture ``exception`` (with its traceback, if it was raised)."""
        return cls(exc_info=(type(exception), exception, exception.__traceback__))

    # -- Data ------------------------------------------------------------------------------------

    @property
    def exception(self) -> BaseException | None:
        """The exception object, or ``None`` when the failure was built from data."""
        return self._exc_info[1] if self._exc_info else None

    @property
    def exc_info(self) -> ExcInfo | None:
        """The ``(type, value, traceback)`` tuple, or ``None`` when built from data."""
        return self._exc_info

    @property
    def exception_str(self) -> str:
        """``str()`` of the exception."""
        return self._exception_str

    @property
    def exception_args(self) -> tuple[Any, ...]:
        """The exception's ``args``."""
        return self._exc_args

    @property
    def traceback_str(self) -> str | None:
        """The formatted traceback (frames only), or ``None`` if unknown."""
        return self._traceback_str

    @property
    def exc_type_names(self) -> tuple[str, ...]:
        """Type names, most derived first, ending with ``Exception`` or ``BaseException``.

        TaskFlow exposes these only by iterating the failure; both work here.
        """
        return self._exc_type_names

    def __iter__(self) -> Iterator[str]:
        """Iterate over :attr:`exc_type_names`."""
        return iter(self._exc_type_names)

    @property
    def causes(self) -> tuple[Failure, ...]:
        """Failures for the exceptions this one was chained from (``__cause__``/``__context__``).

        The whole chain, nearest first; excludes this failure itself.
        """
        if self._causes is None:
            self._causes = self._extract_causes(self.exception)
        return self._causes

    @classmethod
    def _extract_causes(cls, value: BaseException | None) -> tuple[Failure, ...]:
        chain: list[BaseException] = []
        seen: list[BaseException] = [value] if value is not None else []
        while value is not None and len(chain) < _MAX_CAUSES:
            candidates = [value.__cause__]
            if not value.__suppress_context__:
                candidates.append(value.__context__)
            value = next(
                (c for c in candidates if c is not None and not any(c is s for s in seen)), None
            )
            if value is not None:
                seen.append(value)
                chain.append(value)
        failures = [cls.from_exception(e) for e in chain]
        # Each cause's own causes are the rest of the chain; sharing them avoids re-extraction.
        for i, failure in enumerate(failures):
            failure._causes = tuple(failures[i + 1 :])
        return tuple(failures)

    def iter_causes(self) -> Iterator[Failure]:
        """Yield every cause reachable from this failure once, nearest first.

        Works for both the flattened chains this class captures and nested ones from other peers.
        """
        seen: set[tuple[tuple[str, ...], str, str | None]] = set()
        queue = deque(self.causes)
        while queue:
            cause = queue.popleft()
            key = (cause._exc_type_names, cause._exception_str, cause._traceback_str)
            if key in seen:
                continue
            seen.add(key)
            yield cause
            queue.extend(cause.causes)

    # -- Matching --------------------------------------------------------------------------------

    def check(self, *exc_classes: type[BaseException] | str) -> type[BaseException] | str | None:
        """Return the first of ``exc_classes`` this failure is an instance of, by type name.

        Matching is by name, so it works for failures decoded from data.

        Args:
            *exc_classes: Exception types, or names as in :attr:`exc_type_names` (builtins bare,
                others ``module.Name``).

        Returns:
            The matching argument, or ``None``.
        """
        for candidate in exc_classes:
            name = _type_name(candidate) if isinstance(candidate, type) else candidate
            if name in self._exc_type_names:
                return candidate
        return None

    def _matches(self, other: Failure) -> bool:
        return self is other or (
            self._exc_type_names == other._exc_type_names
            and self._exc_args == other._exc_args
            and self._exception_str == other._exception_str
            and self._traceback_str == other._traceback_str
            and self.causes == other.causes
        )

    def matches(self, other: object) -> bool:
        """Tell whether ``other`` is an equivalent failure.

        Unlike ``==``, a failure built from data matches the captured failure it was encoded from.
        """
        if not isinstance(other, Failure):
            return False
        if self._exc_info is None or other._exc_info is None:
            return self._matches(other)
        return self == other

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Failure):
            return NotImplemented
        return self._matches(other) and _same_exc_info(self._exc_info, other._exc_info)

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    # Equality is structural and the exception object is mutable, so failures are unhashable.
    __hash__ = None  # type: ignore[assignment]

    # -- Raising ---------------------------------------------------------------------------------

    def reraise(self) -> NoReturn:
        """Raise the original exception, or :class:`WrappedFailure` if there is none."""
        if not self._exc_info:
            raise exc.WrappedFailure([self])
        exc_type, value, tb = self._exc_info
        if value is None:
            value = exc_type()
        if value.__traceback__ is not tb:
            raise value.with_traceback(tb)
        raise value

    @staticmethod
    def reraise_if_any(failures: Iterable[Failure]) -> None:
        """Re-raise one failure, or several as a :class:`WrappedFailure`; do nothing for none."""
        failures = list(failures)
        if len(failures) == 1:
            failures[0].reraise()
        if failures:
            raise exc.WrappedFailure(failures)

    # -- Formatting ------------------------------------------------------------------------------

    def pformat(self, traceback: bool = False) -> str:
        """Format as ``Failure: <type>: <message>``, optionally followed by the traceback."""
        if self._exc_type_names:
            text = f"Failure: {self._exc_type_names[0]}: {self._exception_str}"
        else:
            text = f"Failure: {self._exception_str}"
        if not traceback:
            return text
        tb = (self._traceback_str or "").rstrip()
        if tb:
            return f"{text}\nTraceback (most recent call last):\n{tb}"
        return f"{text}\nTraceback not available."

    def __str__(self) -> str:
        return self.pformat()

    def __repr__(self) -> str:
        return f"<Failure {self.pformat()!r}>"

    # -- Serialization ---------------------------------------------------------------------------

    @classmethod
    def validate(cls, data: Mapping[str, Any]) -> None:
        """Check that ``data`` is a well-formed failure dict.

        Besides the schema, every ``exc_type_names`` (of the failure and of each cause) must end
        with ``Exception`` or ``BaseException``.

        Raises:
            InvalidFormat: If it is not; the message says which part is wrong.
        """
        from jsonschema import exceptions as schema_exc

        try:
            _validator().validate(data)
        except schema_exc.ValidationError as err:
            raise exc.InvalidFormat(
                f"Failure data not of the expected format: {err.message}", err
            ) from err
        pending: deque[Mapping[str, Any]] = deque([data])
        while pending:
            cause = pending.popleft()
            root = cause["exc_type_names"][-1]
            if root not in cls.BASE_EXCEPTIONS:
                raise exc.InvalidFormat(
                    f"Failure data 'exc_type_names' must end with one of {cls.BASE_EXCEPTIONS},"
                    f" not '{root}' (exception_str: {cause['exception_str']!r})"
                )
            pending.extend(cause.get("causes") or ())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Failure:
        """Build a failure from a :meth:`to_dict` dict; never imports the types it names.

        Fields beyond the version-1 ones are ignored (TaskFlow's schema allows them; a peer may
        add some), and a cause without a ``version`` is read as version 1.

        Raises:
            ValueError: If ``data['version']`` is missing or not :attr:`DICT_VERSION`.
            TypeError: If ``exception_str`` is missing.
        """
        return cls._decode(data, top=True)

    @classmethod
    def _decode(cls, data: Mapping[str, Any], top: bool) -> Failure:
        version = data.get("version", None if top else cls.DICT_VERSION)
        if version != cls.DICT_VERSION:
            raise ValueError(
                f"Invalid dict version of failure object: {version!r}"
                f" (supported: {cls.DICT_VERSION})"
            )
        # Only known fields pass: an "exc_info" key would otherwise bind to the exc_info
        # parameter, and payloads are data, never code.
        fields = {k: v for k, v in data.items() if k in cls._FIELDS}
        if "exception_str" not in fields:
            # Without fields the constructor would capture whatever exception is being handled.
            raise TypeError("Failure data needs 'exception_str'")
        causes = fields.get("causes")
        if causes is not None:
            fields["causes"] = tuple(cls._decode(c, top=False) for c in causes)
        return cls(**fields)

    def to_dict(self, include_args: bool = True) -> dict[str, Any]:
        """Encode as TaskFlow's version-1 failure dict, always JSON-serializable.

        Arguments JSON cannot encode are replaced by their ``repr``.

        Args:
            include_args: Include the exception arguments (``exc_args``), here and in causes.
        """
        return {
            "exception_str": self._exception_str,
            "traceback_str": self._traceback_str,
            "exc_type_names": list(self._exc_type_names),
            "version": self.DICT_VERSION,
            "exc_args": tuple(_json_safe(self._exc_args)) if include_args else (),
            "causes": [c.to_dict(include_args=include_args) for c in self.causes],
        }

    def copy(self) -> Failure:
        """Return an equal failure holding a shallow copy of the exception object."""
        exc_info = None
        if self._exc_info is not None:
            exc_type, value, tb = self._exc_info
            exc_info = (exc_type, copy_mod.copy(value), tb)
        return Failure(
            exc_info=exc_info,
            exception_str=self._exception_str,
            traceback_str=self._traceback_str,
            exc_args=self._exc_args,
            exc_type_names=self._exc_type_names,
            causes=self._causes,
        )

    def redacted(self, secrets: Iterable[Any] | Masker) -> Failure:
        """Return a copy with every form of each of ``secrets`` replaced by ``***``.

        Masks the message, traceback, arguments and causes (see :mod:`flowengine.secrets` for
        the forms). The copy holds no exception object (which could still reveal a secret), so
        re-raising it raises :class:`WrappedFailure`.

        Args:
            secrets: Secret values (empty ones are ignored), or a
                :class:`~flowengine.secrets.Masker`.
        """
        masker = secrets if isinstance(secrets, Masker) else Masker(secrets)
        return Failure(
            exception_str=masker.text(self._exception_str),
            traceback_str=(None if self._traceback_str is None
                           else masker.text(self._traceback_str)),
            exc_args=tuple(masker.value(_json_safe(list(self._exc_args)))),
            exc_type_names=self._exc_type_names,
            causes=tuple(c.redacted(masker) for c in self.causes),
        )

    def shows_any(self, masker: Masker) -> bool:
        """Whether this failure (or a cause) shows a secret ``masker`` masks."""
        texts = (self._exception_str, self._traceback_str or "", repr(self._exc_args))
        return any(masker.found_in(t) for t in texts) or any(
            c.shows_any(masker) for c in self.causes)
