"""Keys the engines write into an atom detail's ``meta``, for the tools that read them back.

Kept apart from the engines so ``flowengine flows``/``show`` and the dashboard read stored
records without importing an engine (its graph library and schemas). When each state was
entered is not kept in ``meta``: see :mod:`flowengine.persistence.state_times`.
"""

from __future__ import annotations

#: Retry meta key: when (seconds since the epoch) its next attempt is due, while it waits.
META_RETRY_DUE = "retry_due"
#: Task meta key: when (seconds since the epoch) the request of a task dispatched with a
#: delay may be taken by a worker (a retried subflow's first tasks on a worker-based engine).
META_DELAYED_UNTIL = "delayed_until"
