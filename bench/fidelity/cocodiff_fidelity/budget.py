"""A measurement's time budget: the seconds since it started and those left before its deadline."""
import time


class Budget:
    def __init__(self, seconds, start=None):
        self.seconds = seconds
        self.start = time.time() if start is None else start

    def elapsed(self):
        """Seconds since the start."""
        return time.time() - self.start

    def left(self):
        """Seconds left (negative past the deadline)."""
        return self.seconds - self.elapsed()
