"""Learning-rate schedules usable with any optimizer."""

__all__ = []
