"""Storage: the engine's view of one flow detail (atom states, results, injected values).

Every change goes to the flow detail's models and, when a backend is given, is written through
to it at once, so an interrupted flow can be resumed by a new engine. What ``engine.storage`` is.

This module is about 700 lines because it carries TaskFlow's whole ``Storage`` API (about forty
short public methods programs already call) and the policy for writes that fail mid-run
(:meth:`Storage.stop_writing`), which needs every write; how argument names are resolved to
providers lives apart, in :mod:`flowengine.providers`, and which values are secret and what is
written of each record, in :mod:`flowengine.persistence.secret_keeping`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from flowengine import exceptions, states
from flowengine.persistence import models
from flowengine.persistence.base import Backend
from flowengine.persistence.secret_keeping import META_SECRETS, SecretKeeper
from flowengine.providers import (
    TRANSIENT,
    Provider,
    ProviderIndex,
    ResultReader,
    ScopeFetcher,
    item_from,
)
from flowengine.retry import History
from flowengine.secrets import Masker
from flowengine.types.failure import Failure

if TYPE_CHECKING:
    from flowengine.atom import Atom

LOG = logging.getLogger(__name__)

# Results are readable from these states (revert still sees what execute produced).
_EXECUTE_RESULT_STATES = frozenset((states.SUCCESS, states.FAILURE, states.REVERTING))
_REVERT_RESULT_STATES = frozenset((states.REVERTED, states.REVERT_FAILURE, states.REVERTING))
#: Meta key holding an atom's persistent injected arguments.
META_INJECTED = "injected"
#: Meta key holding a task's progress.
META_PROGRESS = "progress"
META_PROGRESS_DETAILS = "progress_details"


class Storage:
    """Reads and writes the state of one flow's atoms.

    Args:
        flow_detail: the :class:`~flowengine.persistence.models.FlowDetail` to work on.
        backend: where changes are written through to (None keeps them in memory only).
        scope_fetcher: decides which providers an atom may read from (set by the engine).
    """

    #: The name of the pseudo-atom holding values given to :meth:`inject`.
    injector_name = "_TaskFlow_INJECTOR"  # TaskFlow's spelling: its records name it so

    def __init__(
        self,
        flow_detail: models.FlowDetail,
        backend: Backend | None = None,
        scope_fetcher: ScopeFetcher | None = None,
    ) -> None:
        self._flow_detail = flow_detail
        self._backend = backend
        self._connection = backend.get_connection() if backend is not None else None
        self._lock = threading.RLock()
        self._by_name: dict[str, models.AtomDetail] = {ad.name: ad for ad in flow_detail}
        self._result_mappings: dict[str, dict[str, Any]] = {}
        self._transients: dict[str, Any] = {}
        # A reader over the storage's own tables, not a bound method: the index would hold the
        # storage that holds it (a reference cycle, freed only by a full collection).
        self._providers = ProviderIndex(self.injector_name,
                                        _result_reader(self._transients, self._by_name))
        self._providers.scope_fetcher = scope_fetcher
        self._injected_args: dict[str, dict[str, Any]] = {}
        # Failures keep their exc_info here; the stored copy loses it on serialization.
        self._failures: dict[str, dict[str, Failure]] = {}
        self._unsaved: exceptions.StorageFailure | None = None
        # Checks every write must pass first (the fences of leases the run holds); a tuple,
        # replaced whole, so a write never sees one half changed by another thread.
        self._guards: tuple[Callable[[str], None], ...] = ()
        # Secrets: values masked in whatever is written; names whose values are never stored.
        self._secrets = SecretKeeper(flow_detail.meta.get(META_SECRETS, ()))
        for ad in self._by_name.values():
            self._remember_failures(ad)
        injector = self._by_name.get(self.injector_name)
        if injector is not None and isinstance(injector.results, dict):
            self._map_results(self.injector_name, {k: k for k in injector.results})

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def lock(self) -> threading.RLock:
        """The lock serialising changes (re-entrant)."""
        return self._lock

    @property
    def backend(self) -> Any:
        """The persistence backend.

        Without one, a :class:`~flowengine.persistence.backends.impl_memory.MemoryBackend`
        (``deep_copy`` off) is made on first access, as TaskFlow makes one: it holds the flow
        detail (in no logbook) and every change from then on. Made lazily, so a run nobody
        inspects never pays for copying each change.
        """
        if self._backend is None:
            with self._lock:
                if self._backend is None:
                    self._adopt_memory_backend()
        return self._backend

    def _adopt_memory_backend(self) -> None:
        from flowengine.persistence.backends import impl_memory

        backend = impl_memory.MemoryBackend({"deep_copy": False})
        connection = backend.get_connection()
        connection.update_flow_details(self._stored_flow(), ignore_missing=True)
        self._backend, self._connection = backend, connection

    @property
    def flow_name(self) -> str:
        """Name of the flow this storage belongs to."""
        return self._flow_detail.name

    @property
    def flow_uuid(self) -> str:
        """UUID of the flow detail."""
        return self._flow_detail.uuid

    @property
    def flow_meta(self) -> dict[str, Any]:
        """The flow detail's metadata."""
        return self._flow_detail.meta

    @property
    def flow_detail(self) -> models.FlowDetail:
        """The flow detail itself."""
        return self._flow_detail

    @property
    def _flowdetail(self) -> models.FlowDetail:
        """The flow detail, by the name TaskFlow's suspend/resume samples reach it."""
        return self._flow_detail

    def set_scope_fetcher(self, scope_fetcher: ScopeFetcher | None) -> None:
        """Install the function deciding which providers an atom can see."""
        self._providers.scope_fetcher = scope_fetcher

    def _write(self, what: str, call: Callable[..., Any], *args: Any) -> None:
        """Write through to the backend; any error becomes a StorageFailure naming ``what``.

        After :meth:`stop_writing` nothing reaches the backend: every write raises at once, so
        the engine cannot start an atom whose RUNNING state was never recorded.
        """
        halted = self._unsaved
        if halted is not None:
            raise exceptions.StorageFailure(
                f"Not saving {what} of flow {self.flow_name!r} ({self.flow_uuid}): writing "
                f"stopped after an earlier write failed ({halted})", cause=halted)
        try:
            call(*args)
        except Exception as err:
            if isinstance(err, exceptions.StorageFailure):
                raise
            raise exceptions.StorageFailure(
                f"Could not save {what} of flow {self.flow_name!r} ({self.flow_uuid}) to "
                f"backend {type(self._backend).__name__}: {err}") from err

    def guard_writes(self, guard: Callable[[str], None]) -> Callable[[], None]:
        """Call ``guard(what)`` before every later write; it refuses one by raising a
        :class:`~flowengine.exceptions.StorageFailure` (which halts a running engine). Used for
        the fences of the locks and limits a run holds. Returns what removes the guard.
        """
        with self._lock:
            self._guards = (*self._guards, guard)

        def remove() -> None:
            with self._lock:
                self._guards = tuple(g for g in self._guards if g is not guard)

        return remove

    @property
    def unsaved(self) -> exceptions.StorageFailure | None:
        """The write failure after which this storage stopped writing, if any."""
        return self._unsaved

    def stop_writing(self, failure: exceptions.StorageFailure) -> None:
        """Write nothing more after ``failure``: every later write raises at once.

        The engine calls this when a write of its progress failed (or was fenced off), as it
        halts. Changes still happen in memory, where they are the truth of this process; the
        backend keeps what it last accepted until :meth:`flush_unsaved` writes it all.
        """
        if self._unsaved is None:
            self._unsaved = failure

    def flush_unsaved(self) -> None:
        """Write the whole flow detail after writing stopped, and write through again.

        Raises:
            StorageFailure: the backend still refuses; the error names the first failure too.
        """
        first = self._unsaved
        if first is None or self._connection is None:
            self._unsaved = None
            return
        with self._lock:
            try:
                self._connection.update_flow_details(self._stored_flow())
            except Exception as err:
                raise exceptions.StorageFailure(
                    f"The records of flow {self.flow_name!r} ({self.flow_uuid}) could not be "
                    f"saved to backend {type(self._backend).__name__} ({err}); the first failed "
                    f"write: {first}", cause=first) from err
            self._unsaved = None

    def _guard(self, what: str) -> None:
        # Even with no backend: a run whose lease was lost must stop, stored or not.
        for guard in self._guards:
            guard(what)

    def _save_atom(self, ad: models.AtomDetail) -> None:
        self._guard(f"atom {ad.name!r} ({ad.uuid})")
        if self._connection is not None:
            self._write(f"atom {ad.name!r} ({ad.uuid})", self._connection.update_atom_details,
                        self._secrets.stored_atom(ad))

    def _save_flow(self, with_atoms: bool = True) -> None:
        self._guard("the flow detail")
        if self._connection is not None:
            fields_only = getattr(self._connection, "update_flow_fields", None)
            if with_atoms or fields_only is None:
                self._write("the flow detail", self._connection.update_flow_details,
                            self._stored_flow())
            else:
                self._write("the flow's state", fields_only, self._stored_flow(with_atoms=False))

    # -- secrets --------------------------------------------------------------------------------

    @property
    def masker(self) -> Masker:
        """Masks this flow's secret values (see :mod:`flowengine.secrets`)."""
        return self._secrets.masker

    @property
    def secret_names(self) -> frozenset[str]:
        """Names of the stored values that are secret (kept in memory only)."""
        return frozenset(self._secrets.names)

    def is_secret_name(self, name: str) -> bool:
        """Whether the value stored under ``name`` is secret (a ``Secret`` store value, or a
        name some atom reads into its ``secret_args``)."""
        return name in self._secrets.names or name in self._secrets.sources

    def declare_secret_sources(self, names: Iterable[str]) -> None:
        """Treat values stored under ``names`` as secret (atoms read them as ``secret_args``)."""
        self._secrets.sources.update(names)

    def missing_secrets(self) -> list[str]:
        """Secret names this flow was given once, but not since it was loaded (a resume)."""
        return sorted(self._secrets.names - set(self._transients))

    def masked(self, value: Any) -> Any:
        """``value`` with this flow's secrets masked (a Failure showing one is redacted)."""
        return self._secrets.masked(value)

    def _stored_flow(self, with_atoms: bool = True) -> models.FlowDetail:
        return self._secrets.stored_flow(self._flow_detail, with_atoms)

    def _keep_secret(self, pairs: Mapping[str, Any]) -> None:
        """Hold ``pairs`` (revealed) in memory only, and name them secret in the flow's meta."""
        self._transients.update(pairs)
        self._providers.add(TRANSIENT, {name: name for name in pairs})
        injector = self._by_name.get(self.injector_name)
        # A value stored before it was known to be secret is taken out of the record.
        if injector is not None and isinstance(injector.results, dict) and (
                set(pairs) & set(injector.results)):
            kept = {k: v for k, v in injector.results.items() if k not in pairs}
            injector.put(states.SUCCESS, kept)
            self._map_results(self.injector_name, {name: name for name in kept})
            self._save_atom(injector)
        if not set(pairs) <= self._secrets.names:
            self._secrets.names |= set(pairs)
            self._flow_detail.meta[META_SECRETS] = sorted(self._secrets.names)
            self._save_flow(with_atoms=False)

    def _detail(self, atom_name: str) -> models.AtomDetail:
        try:
            return self._by_name[atom_name]
        except KeyError:
            raise exceptions.NotFound(
                f"Unknown atom name {atom_name!r} in flow {self.flow_name!r}"
            ) from None

    def _remember_failures(self, ad: models.AtomDetail) -> None:
        cache: dict[str, Failure] = {}
        if ad.failure is not None:
            cache[states.EXECUTE] = ad.failure
        if ad.revert_failure is not None:
            cache[states.REVERT] = ad.revert_failure
        self._failures[ad.name] = cache

    def _map_results(self, provider: str, mapping: Mapping[str, Any]) -> None:
        self._result_mappings[provider] = dict(mapping)
        self._providers.add(provider, mapping)

    # -- atoms ------------------------------------------------------------------------------

    def ensure_atoms(self, atoms: Iterable[Any]) -> list[str]:
        """Make sure every atom has a detail record; return their uuids in order.

        New records are written in one flow-detail update, not one write per atom.
        """
        with self._lock:
            created: list[models.AtomDetail] = []
            uuids = [self._ensure(atom, created) for atom in atoms]
            if created:
                self._save_flow()
            return uuids

    def ensure_atom(self, atom: Atom) -> str:
        """Make sure ``atom`` has a detail of the right kind; return its uuid."""
        return self.ensure_atoms([atom])[0]

    def _ensure(self, atom: Atom, created: list[models.AtomDetail]) -> str:
        from flowengine.retry import Retry

        kind = models.RetryDetail if isinstance(atom, Retry) else models.TaskDetail
        ad = self._by_name.get(atom.name)
        if ad is None:
            ad = kind(atom.name, str(uuidlib.uuid4()))
            ad.state = states.PENDING
            ad.intention = states.EXECUTE
            ad.version = ".".join(str(v) for v in atom.version)
            self._flow_detail.add(ad)
            self._by_name[atom.name] = ad
            self._failures[atom.name] = {}
            created.append(ad)
        elif not isinstance(ad, kind):
            raise exceptions.Duplicate(
                f"Atom detail {atom.name!r} already exists in flow detail "
                f"{self.flow_name!r}: it is stored as a {type(ad).__name__}, but the flow now "
                f"has a {type(atom).__name__} by that name"
            )
        self._map_results(atom.name, atom.save_as)
        self._secrets.note_atom(atom)
        return ad.uuid

    def get_atom_uuid(self, atom_name: str) -> str:
        """The uuid of the named atom's detail."""
        return self._detail(atom_name).uuid

    def set_atom_state(self, atom_name: str, state: str, progress: float | None = None,
                       meta: Mapping[str, Any] | None = None) -> None:
        """Set and store the named atom's state (and, in the same write, when it entered it,
        its progress and ``meta`` merged into its metadata)."""
        with self._lock:
            ad = self._detail(atom_name)
            ad.state = state
            _entered(ad, state)
            if progress is not None:
                ad.meta[META_PROGRESS] = progress
            if meta:
                ad.meta.update(meta)
            self._save_atom(ad)

    def get_atom_state(self, atom_name: str) -> str:
        """The named atom's state."""
        return self._detail(atom_name).state  # type: ignore[return-value]

    def set_atom_intention(self, atom_name: str, intention: str) -> None:
        """Set and store what the engine intends to do with the atom next."""
        with self._lock:
            ad = self._detail(atom_name)
            ad.intention = intention
            self._save_atom(ad)

    def get_atom_intention(self, atom_name: str) -> str:
        """What the engine intends to do with the atom next."""
        return self._detail(atom_name).intention  # type: ignore[return-value]

    def get_atoms_states(self, atom_names: Iterable[str]) -> dict[str, tuple[str, str]]:
        """``{name: (state, intention)}`` for the given atoms."""
        with self._lock:
            return {n: (self.get_atom_state(n), self.get_atom_intention(n)) for n in atom_names}

    def update_atom_metadata(self, atom_name: str, update_with: Mapping[str, Any]) -> None:
        """Merge ``update_with`` into the atom's metadata and store it."""
        if not update_with:
            return
        with self._lock:
            ad = self._detail(atom_name)
            ad.meta.update(update_with)
            self._save_atom(ad)

    def set_task_progress(
        self, task_name: str, progress: float, details: Mapping[str, Any] | None = None
    ) -> None:
        """Store a task's progress (0.0-1.0) and optional details."""
        update: dict[str, Any] = {META_PROGRESS: progress}
        # As in TaskFlow: no details keeps the stored ones (the engine moves progress alone),
        # empty details erase them.
        if details is not None:
            update[META_PROGRESS_DETAILS] = (
                {"at_progress": progress, "details": dict(details)} if details else None)
        self.update_atom_metadata(task_name, update)

    def get_task_progress(self, task_name: str) -> float:
        """A task's last stored progress (0.0 when none)."""
        return float(self._detail(task_name).meta.get(META_PROGRESS, 0.0))

    def get_task_progress_details(self, task_name: str) -> dict[str, Any] | None:
        """A task's last stored progress details, if any."""
        return self._detail(task_name).meta.get(META_PROGRESS_DETAILS)

    # -- results ----------------------------------------------------------------------------

    def check_result_shape(self, atom_name: str, result: Any) -> None:
        """Raise InvalidFormat, naming the atom, if ``result`` lacks a name it ``provides``."""
        for name, index in self._result_mappings.get(atom_name, {}).items():
            try:
                item_from(result, index)
            except (IndexError, KeyError, TypeError) as err:
                raise exceptions.InvalidFormat(
                    f"Atom {atom_name!r} provides {name!r} at index {index!r} of its result, "
                    f"but its result ({type(result).__name__}) has no such item"
                ) from err

    def save(
        self, atom_name: str, result: Any, state: str = states.SUCCESS,
        progress: float | None = None, meta: Mapping[str, Any] | None = None,
    ) -> None:
        """Store an atom's result (or failure) with its new state (when it entered it, its
        progress, and ``meta`` merged into its metadata) in one write."""
        with self._lock:
            if isinstance(result, Failure):
                result = self.masked(result)
            else:
                self._secrets.note_result(self._result_mappings.get(atom_name, {}), result,
                                          item_from)
            ad = self._detail(atom_name)
            undone = ad.revert_failure if state == states.REVERTED else None
            ad.put(state, result)
            _entered(ad, state)
            if progress is not None:
                ad.meta[META_PROGRESS] = progress
            if meta:
                ad.meta.update(meta)
            if state in (states.FAILURE, states.REVERT_FAILURE) and ad.intention in (
                states.EXECUTE, states.REVERT,
            ):
                self._failures.setdefault(atom_name, {})[ad.intention] = result
            elif undone is not None:
                # A failed revert that succeeded when run again (a repair): it is no longer
                # one of the flow's failures.
                cached = self._failures.get(atom_name, {}).get(states.REVERT)
                if cached is not None and cached.matches(undone):
                    del self._failures[atom_name][states.REVERT]
            self._save_atom(ad)

    def save_retry_failure(self, retry_name: str, failed_atom_name: str, failure: Failure) -> None:
        """Record a subflow failure in the retry controller's current history entry."""
        with self._lock:
            ad = self._detail(retry_name)
            if not isinstance(ad, models.RetryDetail):
                raise exceptions.StorageFailure(f"Atom {retry_name!r} is not a retry controller")
            try:
                failures = ad.last_failures
            except exceptions.NotFound as err:
                raise exceptions.StorageFailure(
                    f"Retry {retry_name!r} has no history entry to add the failure of "
                    f"{failed_atom_name!r} to"
                ) from err
            if failed_atom_name not in failures:
                failures[failed_atom_name] = failure
                self._save_atom(ad)

    def cleanup_retry_history(self, retry_name: str, state: str) -> None:
        """Forget a retry controller's history and set its state."""
        with self._lock:
            ad = self._detail(retry_name)
            ad.state = state
            _entered(ad, state)
            ad.results = []
            self._save_atom(ad)

    def _get(self, atom_name: str, revert: bool) -> Any:
        ad = self._detail(atom_name)
        failure = ad.revert_failure if revert else ad.failure
        key = states.REVERT if revert else states.EXECUTE
        if failure is not None:
            cached = self._failures.get(atom_name, {}).get(key)
            return cached if cached is not None and cached.matches(failure) else failure
        allowed = _REVERT_RESULT_STATES if revert else _EXECUTE_RESULT_STATES
        what = "revert" if revert else "execution"
        if ad.state not in allowed:
            reason = " (as it was ignored)" if ad.state == states.IGNORE else ""
            raise exceptions.NotFound(
                f"Result for atom {atom_name!r} {what} is not known{reason}: it is in state "
                f"{ad.state}"
            )
        return ad.revert_results if revert else ad.results

    def get_execute_result(self, atom_name: str) -> Any:
        """What the atom's ``execute`` returned (or its Failure); a retry's whole history."""
        return self._get(atom_name, revert=False)

    get = get_execute_result

    def get_revert_result(self, atom_name: str) -> Any:
        """What the atom's ``revert`` returned (or its Failure)."""
        return self._get(atom_name, revert=True)

    def _failures_for(self, key: str) -> dict[str, Failure]:
        return {name: c[key] for name, c in self._failures.items() if key in c}

    def get_execute_failures(self) -> dict[str, Failure]:
        """``{atom_name: Failure}`` of every failed ``execute``."""
        return self._failures_for(states.EXECUTE)

    get_failures = get_execute_failures

    def get_revert_failures(self) -> dict[str, Failure]:
        """``{atom_name: Failure}`` of every failed ``revert``."""
        return self._failures_for(states.REVERT)

    def has_failures(self) -> bool:
        """Whether any atom has failed."""
        return any(self._failures.values())

    def reset(self, atom_name: str, state: str = states.PENDING,
              keep_failures: bool = False) -> None:
        """Forget the atom's results and put it in ``state``.

        With ``keep_failures``, :meth:`get_execute_failures` still lists the atom's last failure
        (a retry's reset: TaskFlow's storage keeps it until the atom fails again).
        """
        if atom_name == self.injector_name:
            return
        with self._lock:
            ad = self._detail(atom_name)
            if ad.state == state:
                return
            ad.reset(state)
            _entered(ad, state)
            if not keep_failures:
                self._failures[atom_name] = {}
            self._save_atom(ad)

    # -- injected values --------------------------------------------------------------------

    def inject_atom_args(
        self, atom_name: str, pairs: Mapping[str, Any], transient: bool = True
    ) -> None:
        """Give the named atom (only) these argument values."""
        if atom_name not in self._by_name:
            raise exceptions.NotFound(f"Unknown atom name {atom_name!r} in flow {self.flow_name!r}")
        with self._lock:
            # Secret values stay in memory; the rest is stored as asked.
            secret, pairs = self._secrets.split_for_atom(atom_name, pairs)
            self._injected_args.setdefault(atom_name, {}).update(secret)
            if transient:
                self._injected_args.setdefault(atom_name, {}).update(pairs)
            else:
                ad = self._detail(atom_name)
                injected = dict(ad.meta.get(META_INJECTED, {}))
                injected.update(pairs)
                ad.meta[META_INJECTED] = injected
                self._save_atom(ad)

    def inject(self, pairs: Mapping[str, Any] | Iterable[tuple[str, Any]],
               transient: bool = False) -> None:
        """Make values available to every atom by name (stored unless ``transient``).

        ``pairs`` is a mapping or, as TaskFlow also takes, an iterable of ``(name, value)``.
        Values wrapped in :class:`~flowengine.secrets.Secret`, and values of names already
        known to be secret, are kept in memory only and masked wherever they would be shown.
        """
        pairs = dict(pairs)
        with self._lock:
            secret, pairs = self._secrets.split(pairs)
            if secret:
                self._keep_secret(secret)
                if not pairs:
                    return
            if transient:
                self._transients.update(pairs)
                self._providers.add(TRANSIENT, {name: name for name in pairs})
                return
            ad = self._by_name.get(self.injector_name)
            if ad is None:
                ad = models.TaskDetail(self.injector_name, str(uuidlib.uuid4()))
                ad.state = states.SUCCESS
                ad.intention = states.EXECUTE
                ad.results = {}
                self._flow_detail.add(ad)
                self._by_name[self.injector_name] = ad
                self._save_flow()
            results = dict(ad.results or {})
            results.update(pairs)
            ad.put(states.SUCCESS, results)
            self._save_atom(ad)
            self._map_results(self.injector_name, {name: name for name in results})

    # -- argument resolution ----------------------------------------------------------------

    def _injected_for(self, atom_name: str) -> dict[str, Any]:
        injected = dict(self._detail(atom_name).meta.get(META_INJECTED, {}))
        injected.update(self._injected_args.get(atom_name, {}))
        return injected

    def fetch_mapped_args(
        self,
        args_mapping: Mapping[str, str],
        atom_name: str | None = None,
        scope_walker: Iterable[Iterable[str]] | None = None,  # TaskFlow's ScopeWalker; ignored
        optional_args: Iterable[str] | None = None,
    ) -> dict[str, Any]:
        """Resolve an atom's ``{argument: stored name}`` mapping to ``{argument: value}``.

        Atom-specific injected values win, then flow-level injected values, then the results of
        the closest visible providers.

        Raises:
            NotFound: a required name cannot be resolved; the message names atom and argument.
        """
        if not args_mapping:
            return {}
        optional = set(optional_args or ())
        injected = self._injected_for(atom_name) if atom_name is not None else {}
        result: dict[str, Any] = {}
        with self._lock:
            for arg, name in args_mapping.items():
                if name in injected:
                    result[arg] = injected[name]
                    continue
                found, value, why = self._providers.lookup(atom_name, name)
                if found:
                    result[arg] = value
                elif arg not in optional and name not in optional:
                    # TaskFlow's wording first (programs match on it), then which atom.
                    if name not in self._providers.names():
                        prefix = (f"Name {name!r} is not mapped as a produced output by any "
                                  f"providers")
                    else:
                        prefix = (f"Mapped argument {arg!r} <= {name!r} was not produced by "
                                  f"any accessible provider")
                    raise exceptions.NotFound(
                        f"{prefix} (atom {atom_name!r} argument {arg!r}: {why})")
            if atom_name is not None:
                self._secrets.note_arguments(atom_name, result)
        return result

    def fetch_unsatisfied_args(
        self,
        atom_name: str,
        args_mapping: Mapping[str, str],
        scope_walker: Iterable[Iterable[str]] | None = None,  # TaskFlow's ScopeWalker; ignored
        optional_args: Iterable[str] | None = None,
    ) -> set[str]:
        """Names in ``args_mapping`` nothing visible to the atom could ever provide."""
        return self._providers.unsatisfied(atom_name, args_mapping,
                                           self._injected_for(atom_name), optional_args or ())

    def fetch(self, name: str, many_handler: Callable[[list[Any]], Any] | None = None) -> Any:
        """The value stored under ``name`` (the first of several, unless ``many_handler``).

        As TaskFlow's: a failed provider's value is its Failure, and a provider that has not
        finished (nor was ignored) makes the name unfetchable.
        """
        with self._lock:
            values = self._providers.fetch_values(name, self._fetchable)
        if not values and name in self._providers.names():
            raise exceptions.NotFound(f"Unable to find result {name!r}: no provider of it in flow "
                                      f"{self.flow_name!r} has it (not run, failed, or its "
                                      f"result lacks it)")
        if not values:
            raise exceptions.NotFound(f"Name {name!r} is not mapped as a produced output by any "
                                      f"providers in flow "
                                      f"{self.flow_name!r}")
        return many_handler(values) if many_handler else values[0]

    def _fetchable(self, provider: Provider) -> tuple[bool, Any]:
        """``(found, value)`` of one provider for :meth:`fetch`; NotFound if it cannot say yet."""
        if provider.name is TRANSIENT:
            return True, self._transients[provider.index]
        ad = self._detail(provider.name)
        if ad.failure is None and ad.state == states.IGNORE:
            return False, None
        try:
            value = self._get(provider.name, revert=False)
            if isinstance(ad, models.RetryDetail) and ad.failure is None:
                value = ad.last_results
            return True, item_from(value, provider.index)
        except (IndexError, KeyError, TypeError, ValueError) as err:
            raise exceptions.NotFound(
                f"Unable to find result {provider.name!r}: its result has no item "
                f"{provider.index!r}") from err

    def fetch_all(self, many_handler: Callable[[list[Any]], Any] | None = None) -> dict[str, Any]:
        """Every name with a value: one value, or a list when several providers have one."""
        def default(values: list[Any]) -> Any:
            return values if len(values) > 1 else values[0]

        found: dict[str, Any] = {}
        for name in self._providers.names():
            try:
                found[name] = self.fetch(name, many_handler or default)
            except exceptions.NotFound:
                pass
        return found

    # -- flow state -------------------------------------------------------------------------

    def set_flow_state(self, state: str) -> None:
        """Set and store the flow's state (and, in the same write, when it entered it)."""
        with self._lock:
            self._flow_detail.state = state
            _entered(self._flow_detail, state)
            self._save_flow(with_atoms=False)

    def get_flow_state(self) -> str:
        """The flow's state (PENDING when never set)."""
        return self._flow_detail.state or states.PENDING

    def change_flow_state(self, state: str) -> tuple[bool, str]:
        """Move the flow to ``state`` if allowed; return ``(moved, old_state)``."""
        with self._lock:
            old_state = self.get_flow_state()
            if not states.check_flow_transition(old_state, state):
                return False, old_state
            self.set_flow_state(state)
            return True, old_state

    def update_flow_metadata(self, update_with: Mapping[str, Any]) -> None:
        """Merge ``update_with`` into the flow's metadata and store it."""
        with self._lock:
            self._flow_detail.meta.update(update_with)
            self._save_flow(with_atoms=False)

    # -- retries ----------------------------------------------------------------------------

    def get_retry_history(self, retry_name: str) -> History:
        """The named retry controller's :class:`~flowengine.retry.History`."""
        ad = self._detail(retry_name)
        if not isinstance(ad, models.RetryDetail):
            raise exceptions.NotFound(f"Atom {retry_name!r} is not a retry controller")
        cached = self._failures.get(retry_name, {}).get(states.EXECUTE)
        failure = cached if cached is not None else ad.failure
        return History(list(ad.results), failure=failure)

    def get_retry_histories(self) -> list[tuple[str, History]]:
        """``(name, History)`` of every retry controller."""
        return [(ad.name, self.get_retry_history(ad.name))
                for ad in self._by_name.values() if isinstance(ad, models.RetryDetail)]


def _result_reader(transients: Mapping[str, Any],
                   by_name: Mapping[str, models.AtomDetail]) -> ResultReader:
    """What reads one provider's item from a storage's tables: ``(found, value)``; ignored or
    unfinished providers miss."""

    def read(provider: Provider) -> tuple[bool, Any]:
        if provider.name is TRANSIENT:
            return True, transients[provider.index]
        ad = by_name.get(provider.name)
        if ad is None or ad.state not in _EXECUTE_RESULT_STATES or ad.failure is not None:
            return False, None
        try:
            return True, item_from(ad.last_results, provider.index)
        except (IndexError, KeyError, TypeError):
            return False, None

    return read


def _entered(detail: models.FlowDetail | models.AtomDetail, state: str) -> None:
    """Note when ``detail`` entered ``state``, for the write that stores the state: every engine
    records it, outside ``meta`` (see :mod:`flowengine.persistence.state_times`)."""
    detail.times[state] = time.time()
