"""Fused recurrent layers over time-major (T, B, F) sequences."""

__all__ = []
