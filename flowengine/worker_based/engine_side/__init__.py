"""The engine side of the worker protocol: what an engine's process does with remote tasks.

:mod:`.lifecycle` is one attempt (one delivery of one atom's execute or revert to a worker) as
a value and its transition function; :mod:`.replies` reads a worker's reply as a lifecycle
event; :mod:`.outgoing` builds a request's headers and sends revocations and stops;
:mod:`.delayed_dispatch` and :mod:`.held_publishes` hold a delayed request in the broker or in
the process until it is due; :mod:`.unserved` tells why no worker takes a topic's requests.
The executor, TaskFlow's :class:`~flowengine.worker_based.executor.WorkerTaskExecutor`, keeps
an engine's attempts in flight and carries out what each transition says; the process's
broker client (:mod:`~flowengine.worker_based.client`) routes replies to it.

Nothing here imports the worker side (:mod:`~flowengine.worker_based.worker_side`).
"""
