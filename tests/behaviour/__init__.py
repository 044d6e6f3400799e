"""Engine behaviour suite: one set of scenarios run against every engine and backend."""
