"""The worker side of the worker protocol: what a worker process does with a request.

TaskFlow's names stay where TaskFlow's programs import them: the
:class:`~flowengine.worker_based.worker.Worker`, its
:class:`~flowengine.worker_based.server.Server` (the one place a request starts running) and
the :class:`~flowengine.worker_based.endpoint.Endpoint` that calls a task. What they use is
here: reading a request (:mod:`.request_reading`), heartbeats (:mod:`.heartbeats`), replies
(:mod:`.replies`), refused replays (:mod:`.replays`), per-task limits (:mod:`.limits`), the
event loop of ``async def`` tasks (:mod:`.async_runner`) and the thread pool's autoscaling
(:mod:`.autoscale`). The control messages engines send to workers, with what a worker does
with them, stay beside the package: :mod:`~flowengine.worker_based.cancellation` (CANCEL),
:mod:`~flowengine.worker_based.running_calls` (STOP), :mod:`~flowengine.worker_based.pause`
and :mod:`~flowengine.worker_based.remote_control`.

Nothing here imports the engine side (:mod:`~flowengine.worker_based.engine_side`).
"""
