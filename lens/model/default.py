"""The model every command and study uses unless told otherwise (cheap to import: no torch)."""

DEFAULT_MODEL = "smollm2-135m"
