"""Lens Workbench: capture a language model's states layer by layer and analyse them.

```python
import lens
model = lens.load_model("smollm2-135m")
store = lens.capture(model, corpus="wiki-sample", sites=["resid_post"], max_tokens=20_000, out="stores/smol")
X = lens.open_store("stores/smol").get(layer=12, site="resid_post")   # (token, d_model)
```
"""

import importlib

from lens.runtime import progress as _progress  # noqa: F401 (first: tqdm.auto without its notebook warning)

# Every public name, from the module that defines it. Imported on first use (PEP 562), so that
# ``import lens.capturing.spec`` or ``lens --help`` does not pay for torch and transformers.
_PUBLIC = {
    "capture": "lens.capturing.capture", "CaptureSpec": "lens.capturing.spec",
    "collect_stats": "lens.capturing.collect", "collect_positions": "lens.capturing.collect",
    "StatsRun": "lens.capturing.collect", "PositionStates": "lens.capturing.collect",
    "Corpus": "lens.text.corpora", "Document": "lens.text.corpora", "list_corpora": "lens.text.corpora",
    "load_corpus": "lens.text.corpora",
    "LensInputError": "lens.errors", "StoreCorruptError": "lens.errors",
    "ablation_scan": "lens.interventions.ablation", "delete_layer": "lens.interventions.ablation",
    "swap_layers": "lens.interventions.ablation",
    "LayerStats": "lens.store.layer_stats", "load_stats": "lens.store.layer_stats", "save_stats": "lens.store.layer_stats",
    "ALIASES": "lens.model.loading", "list_models": "lens.model.loading", "load_model": "lens.model.loading",
    "DEFAULT_MODEL": "lens.model.default",
    "LensResult": "lens.readout.logit_lens", "LoadedModel": "lens.model.loaded",
    "HookSite": "lens.sites", "Site": "lens.sites",
    "Store": "lens.store.reader", "open_store": "lens.store.reader",
    "export_store": "lens.capturing.exchange", "import_store": "lens.capturing.exchange",
    "CorpusTransform": "lens.text.transforms", "parse_transform": "lens.text.transforms",
    "TunedLens": "lens.readout.tuned_lens", "fit_tuned_lens": "lens.readout.tuned_lens",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'lens' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__():
    return sorted({*globals(), *_PUBLIC})
