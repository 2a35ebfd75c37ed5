"""Lens Workbench: capture a language model's states layer by layer and analyse them.

```python
import lens
model = lens.load_model("smollm2-135m")
store = lens.capture(model, corpus="wiki-sample", sites=["resid_post"], max_tokens=20_000, out="stores/smol")
X = lens.open_store("stores/smol").get(layer=12, site="resid_post")   # (token, d_model)
```
"""

_HOME = {  # public name -> the module it lives in (imported on first use: `import lens` stays cheap,
           # so lens.errors or lens.sites, the explorer and `lens --help` do not pay for torch)
    'capture': 'lens.capturing.capture',
    'PositionStates': 'lens.capturing.collect',
    'StatsRun': 'lens.capturing.collect',
    'collect_positions': 'lens.capturing.collect',
    'collect_stats': 'lens.capturing.collect',
    'Corpus': 'lens.text.corpora',
    'Document': 'lens.text.corpora',
    'list_corpora': 'lens.text.corpora',
    'load_corpus': 'lens.text.corpora',
    'LensInputError': 'lens.errors',
    'StoreCorruptError': 'lens.errors',
    'ablation_scan': 'lens.interventions.ablation',
    'delete_layer': 'lens.interventions.ablation',
    'swap_layers': 'lens.interventions.ablation',
    'LayerStats': 'lens.store.layer_stats',
    'load_stats': 'lens.store.layer_stats',
    'save_stats': 'lens.store.layer_stats',
    'ALIASES': 'lens.model.loading',
    'DEFAULT_MODEL': 'lens.model.loading',
    'list_models': 'lens.model.loading',
    'load_model': 'lens.model.loading',
    'LensResult': 'lens.readout.logit_lens',
    'LoadedModel': 'lens.model.loaded',
    'HookSite': 'lens.sites',
    'Site': 'lens.sites',
    'Store': 'lens.store.reader',
    'open_store': 'lens.store.reader',
    'CorpusTransform': 'lens.text.transforms',
    'parse_transform': 'lens.text.transforms',
    'TunedLens': 'lens.readout.tuned_lens',
    'fit_tuned_lens': 'lens.readout.tuned_lens',
}

__all__ = [
    "capture", "collect_stats", "collect_positions", "StatsRun", "PositionStates", "LayerStats", "save_stats",
    "load_stats", "open_store", "load_model", "list_models", "list_corpora", "load_corpus", "Corpus",
    "Document", "LoadedModel", "Store", "Site", "HookSite", "LensInputError", "StoreCorruptError",
    "ALIASES", "DEFAULT_MODEL", "CorpusTransform", "parse_transform",
    "LensResult", "TunedLens", "fit_tuned_lens", "delete_layer", "swap_layers", "ablation_scan",
]


def __getattr__(name: str):
    if name in _HOME:
        import importlib

        value = getattr(importlib.import_module(_HOME[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lens' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_HOME))
