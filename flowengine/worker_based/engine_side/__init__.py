"""The engine side of the worker protocol: what an engine's process does with remote tasks.

:mod:`.lifecycle` is one attempt (one delivery of one atom's execute or revert to a worker) as
a value and its transition function; :mod:`.attempts` keeps a process's executors' attempts
and carries out what each transition says. The face engines use is TaskFlow's
:class:`~flowengine.worker_based.executor.WorkerTaskExecutor`.
"""
