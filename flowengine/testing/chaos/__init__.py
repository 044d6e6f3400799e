"""Chaos certification: run a flow many times on real workers while killing, freezing and
restarting them and the engine, then certify what happened (see doc/proving.rst).

The pieces: :mod:`.schedule` (the seeded schedule of faults), :mod:`.engine_process` (the engine
process that runs and resumes the flows), :mod:`.orchestra` (starts everything and applies the
schedule), :mod:`.certify` (reads the stored flows and the logs and judges them).
"""
