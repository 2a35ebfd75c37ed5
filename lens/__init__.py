"""Lens Workbench: capture a language model's states layer by layer and analyse them.

```python
import lens
model = lens.load_model("smollm2-135m")
store = lens.capture(model, corpus="wiki-sample", sites=["resid_post"], max_tokens=20_000, out="stores/smol")
X = lens.open_store("stores/smol").get(layer=12, site="resid_post")   # (token, d_model)
```
"""

from lens.capturing.capture import capture
from lens.capturing.spec import CaptureSpec
from lens.capturing.collect import PositionStates, StatsRun, collect_positions, collect_stats
from lens.text.corpora import Corpus, Document, list_corpora, load_corpus
from lens.errors import LensInputError, StoreCorruptError
from lens.interventions.ablation import ablation_scan, delete_layer, swap_layers
from lens.store.layer_stats import LayerStats, load_stats, save_stats
from lens.model.loading import ALIASES, DEFAULT_MODEL, list_models, load_model
from lens.readout.logit_lens import LensResult
from lens.model.loaded import LoadedModel
from lens.sites import HookSite, Site
from lens.store.reader import Store, open_store
from lens.text.transforms import CorpusTransform, parse_transform
from lens.readout.tuned_lens import TunedLens, fit_tuned_lens

__all__ = [
    "capture", "CaptureSpec", "collect_stats", "collect_positions", "StatsRun", "PositionStates", "LayerStats",
    "save_stats", "load_stats", "open_store", "load_model", "list_models", "list_corpora", "load_corpus", "Corpus",
    "Document", "LoadedModel", "Store", "Site", "HookSite", "LensInputError", "StoreCorruptError",
    "ALIASES", "DEFAULT_MODEL", "CorpusTransform", "parse_transform",
    "LensResult", "TunedLens", "fit_tuned_lens", "delete_layer", "swap_layers", "ablation_scan",
]
