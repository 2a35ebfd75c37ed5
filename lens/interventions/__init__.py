"""Changed forward passes: layer deletion and swaps, activation steering, replay from a layer, and the prefix
cache they share."""
