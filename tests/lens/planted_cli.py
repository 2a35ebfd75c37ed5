"""Run the real ``lens`` command line with a deliberately wrong site map: every model it loads has its
``resid_post`` tap shifted by one block (layer ``l`` reads block ``l + 1``; the last layer, which has no
next block, reads itself) — a planted off-by-one layer, the kind of mistake the capture's fidelity check
(lens.capturing.fidelity) exists to catch. Nothing else is changed: the model, the backends and the CLI
are the real ones.

Usage: python tests/lens/planted_cli.py ARGV...  (ARGV as for ``lens``; exits with its code)."""

from __future__ import annotations

import dataclasses
import sys


@dataclasses.dataclass(frozen=True)
class OffByOne:
    """A tap at the next block: ``at(l)`` is block ``min(l + 1, n_layers - 1)``."""

    path: str
    kind: str
    flat_tokens: bool = False
    n_layers: int = 1

    def at(self, layer):
        return self.path.format(l=min((layer or 0) + 1, self.n_layers - 1))


def plant() -> None:
    import lens.model.loading as loading
    from lens.sites import Site

    derive = loading.derive_site_map

    def planted(model, **kw):
        sm = derive(model, **kw)
        tap = sm.taps[Site.RESID_POST]
        return dataclasses.replace(sm, taps={**sm.taps, Site.RESID_POST: OffByOne(tap.path, tap.kind, tap.flat_tokens,
                                                                                  sm.n_layers)})

    loading.derive_site_map = planted


if __name__ == "__main__":
    plant()
    from app.commands.cli import main

    sys.exit(main(sys.argv[1:]))
