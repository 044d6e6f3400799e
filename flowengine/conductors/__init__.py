"""Conductors: TaskFlow's ``conductors`` package (see :mod:`flowengine.conductors.base`)."""
