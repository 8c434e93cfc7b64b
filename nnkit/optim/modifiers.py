"""Gradient and weight modifiers that attach to an optimizer."""

__all__ = []
