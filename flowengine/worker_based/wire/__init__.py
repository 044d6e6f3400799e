"""The wire's small facts both sides read: header names (:mod:`.headers`), the bounds an
untrusted message is held to (:mod:`.bounds`), TaskFlow's request states
(:mod:`.request_machine`), the control messages' shape (:mod:`.control`) and task versions
(:mod:`.versions`). The messages themselves are TaskFlow's
:mod:`~flowengine.worker_based.protocol`.

Nothing here imports either side.
"""
