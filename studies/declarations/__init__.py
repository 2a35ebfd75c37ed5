"""Plain-data declarations of every study (one module each): names, labels, units, layer axis,
headlines and claims. Importing them costs no torch (tests/studies/test_declarations.py checks)."""
