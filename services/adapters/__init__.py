"""Adapters to the outside: the Redis event store, crypto, the embedding model, Redis connections."""
