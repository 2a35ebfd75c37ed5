"""Stores: the checksummed, resumable on-disk format of captured states (writer, reader, parts and merge, verify),
its position rules and per-layer statistics, and the views and sums ``geometry`` and ``probes`` may read."""
