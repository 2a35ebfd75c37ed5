"""Architecture families: derive any transformers model's hook-site map from its module tree.

See :mod:`lens.model.arch.derive` for how (its steps in config, tree, blocks, head, embedding and identities),
:mod:`lens.model.arch.names` for the only module-name strings.
"""

from lens.model.arch.derive import derive_site_map
from lens.model.arch.head import apply_logit_factors
from lens.model.arch.site_map import Head, SiteMap
from lens.model.arch.taps import Tap

__all__ = ["derive_site_map", "apply_logit_factors", "SiteMap", "Head", "Tap"]
