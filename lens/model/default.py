"""The model every command and study uses unless told otherwise, and the choices of how a model is loaded,
said once here (cheap to import: no torch): :mod:`lens.model.loading` checks them and
:mod:`lens.capturing.settings` offers them as the command line's choices."""

DEFAULT_MODEL = "smollm2-135m"

MODEL_DTYPES = ("auto", "float32", "bfloat16", "float16")  # --model-dtype: the weights' and forward pass' dtype
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")  # --attn: transformers' attn_implementation
