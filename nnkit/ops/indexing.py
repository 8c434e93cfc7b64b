"""Indexing and joins: GetItem (x[...]), Concat, Stack, Split, Flatten, Pad, Broadcast."""

__all__ = []
