"""Elementwise math beyond arithmetic: Sqrt, Abs, Clip, Where, Maximum, Minimum, Sin, Cos."""

__all__ = []
