"""Capture: hook backends (``backends``), the capture loop and its pipeline, one-pass statistics and position
collection, token spans, the size estimate before a capture, and launches across processes and machines.
(Named ``capturing`` so that ``lens.capture`` stays the function.)"""
