"""flowengine: reliable multi-step workflows with TaskFlow's API.

A flow of atoms (tasks and retry controllers) is compiled into a dependency graph and run by an
engine: serially, on threads, or on remote worker processes. See ``doc/`` for the concepts.
"""

__version__ = "0.1.0"


def _default_hooks() -> None:
    # What every engine attaches unless told otherwise: the atom log, then tracing. Put here,
    # in the package's face, because the engines import neither (see flowengine.hooks).
    from flowengine import hooks
    from flowengine.listeners.atoms import AtomLogHook
    from flowengine.tracing import TracingHook

    hooks.defaults.extend([AtomLogHook(), TracingHook()])


_default_hooks()
