"""The memory console (`engram console`): see, search, trace and forget what an agent remembers,
in a browser."""
