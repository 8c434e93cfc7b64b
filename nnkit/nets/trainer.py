"""Trainer and hooks: an optional loop over the define-by-run graph."""

__all__ = []
