"""Persistence: the records of flows and atoms (``models``) and where they are kept (``backends``).

See ``doc/persistence.rst``.
"""
