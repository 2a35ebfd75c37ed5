"""Architecture families: derive any transformers model's hook-site map from its module tree.

See :mod:`lens.arch.derive` for how, :mod:`lens.arch.names` for the only module-name strings.
"""

from lens.arch.derive import apply_logit_factors, derive_site_map
from lens.arch.site_map import Head, SiteMap
from lens.arch.taps import Tap

__all__ = ["derive_site_map", "apply_logit_factors", "SiteMap", "Head", "Tap"]
