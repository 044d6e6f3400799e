"""flowengine: reliable multi-step workflows with TaskFlow's API.

A flow of atoms (tasks and retry controllers) is compiled into a dependency graph and run by an
engine: serially, on threads, or on remote worker processes. See ``doc/`` for the concepts.
"""

__version__ = "0.1.0"
