"""Helpers with no dependency on any layer of Engram, for every layer to use."""
