"""Progress bars: ``tqdm.auto`` (a widget in a notebook that has ipywidgets, a text bar anywhere else), imported
here first and quietly. In a Jupyter kernel without ipywidgets, importing ``tqdm.auto`` warns "IProgress not
found" and then draws its text bar all the same: that warning would open every notebook that imports lens.
``lens`` imports this module before anything else, so the modules that import ``tqdm.auto`` get it already loaded.
"""

from __future__ import annotations

import warnings

from tqdm import TqdmWarning

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="IProgress not found", category=TqdmWarning)
    from tqdm.auto import tqdm  # noqa: F401 (the bar the lens modules use)
