"""Scheduler shells: the I/O around the pure scheduling core."""
