"""Read-outs of captured states: the logit lens, the tuned lens, their shared per-row statistics, and the memo
that runs a lens over a store."""
