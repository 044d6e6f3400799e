"""Jobboards: TaskFlow's ``jobs`` package (see :mod:`flowengine.jobs.base`)."""
