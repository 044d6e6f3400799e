"""Differential conformance: the same programs run on TaskFlow 6.5 and on flowengine."""
