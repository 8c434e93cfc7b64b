"""Saving and loading parameters and optimizer state (.npz + JSON, never pickle or eval)."""

__all__ = []
