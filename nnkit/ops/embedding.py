"""Embedding lookup."""

__all__ = []
