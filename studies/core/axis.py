"""The typed ``layer`` axis of a result (issue #24: "layer" meant five things): what an entry of ``layers``
means, the site it is read at and its title. Plain data with no imports of the project's own, so the results
folder (:mod:`studies.reporting.results`) can read an axis back without importing the contract; the contract
re-exports every name."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class AxisKind(str, enum.Enum):
    """What an entry of a result's ``layers`` means (issue #24: "layer" meant five things)."""

    BLOCK = "block"  # l: the output of block l at the axis' site
    TRANSITION = "transition"  # l: the map from block l to block l + 1
    DEPTH = "depth"  # embeddings first: 0 = the embeddings, l + 1 = block l
    ABLATED = "ablated"  # l: block l deleted, or blocks l and l + 1 swapped
    NONE = "none"  # no per-layer values


# what entry l of a block axis is, per site (the wording of lens/sites.py's conventions); "{}" is the site
_BLOCK_TITLES = {"resid_post": "layer (output of block l, {})", "resid_pre": "layer (input of block l, {})",
                 "resid_mid": "layer (after attention of block l, before its MLP, {})",
                 "attn_out": "layer (what the attention of block l adds, {})",
                 "mlp_out": "layer (what the MLP of block l adds, {})",
                 "embed": "embeddings (input of block 0, {})", "final_norm": "final norm output ({})",
                 "router_logits": "layer (router logits of block l, {})"}


@dataclass(frozen=True)
class LayerAxis:
    """The typed ``layer`` axis of a result: its kind, the site it is read at (for blocks) and a short
    note; :attr:`title` is the axis title the explorer and the report draw."""

    kind: AxisKind = AxisKind.BLOCK
    site: str = "resid_post"
    note: str = ""

    @property
    def title(self) -> str:
        base = {AxisKind.BLOCK: _BLOCK_TITLES.get(self.site, "layer (block l, {})").format(self.site),
                AxisKind.TRANSITION: f"transition l → l+1 ({self.site})" if self.site else "transition l → l+1",
                AxisKind.DEPTH: "depth (0 = embeddings, l + 1 = block l)",
                AxisKind.ABLATED: "block l deleted (swap: blocks l, l+1)",
                AxisKind.NONE: "no layer axis"}[self.kind]
        return f"{base}, {self.note}" if self.note else base

    def at_site(self, site) -> "LayerAxis":
        """This axis read at ``site`` (a run's configured site: a study run on ``resid_mid`` is drawn under a
        resid_mid axis, not the declaration's literal); itself when ``site`` is None or the axis has no site."""
        if site is None or not self.site:
            return self
        return LayerAxis(self.kind, str(getattr(site, "value", site)), self.note)

    def to_dict(self) -> dict:
        """The axis as result.json records it (``layer_axis`` beside ``layers``)."""
        return {"kind": self.kind.value, "site": self.site, "note": self.note}

    @classmethod
    def from_dict(cls, data) -> "LayerAxis | None":
        """The axis a result.json recorded, or None for a value not of that shape (an old or foreign record)."""
        if not isinstance(data, dict) or not all(isinstance(data.get(k, ""), str) for k in ("kind", "site", "note")):
            return None
        try:
            kind = AxisKind(data.get("kind", AxisKind.BLOCK.value))
        except ValueError:
            return None
        return cls(kind, data.get("site", "resid_post"), data.get("note", ""))

    def tick(self, layer) -> str:
        """One entry of the axis as text (``12``, ``12→13``)."""
        return f"{layer}→{int(layer) + 1}" if self.kind is AxisKind.TRANSITION else str(layer)

    def __str__(self) -> str:
        return self.title

    @classmethod
    def from_text(cls, text: str) -> "LayerAxis":
        """The axis a free-text description names (what results declared before the axis was typed)."""
        t = text.lower()
        kind = (AxisKind.NONE if t.startswith("none") else AxisKind.TRANSITION if "→" in t or "transition" in t
                else AxisKind.ABLATED if "deleted" in t or "swapped" in t
                else AxisKind.DEPTH if "embedding" in t else AxisKind.BLOCK)
        site = next((w for w in re.findall(r"[a-z_]+", t) if w in ("resid_pre", "resid_mid", "resid_post",
                                                                   "attn_out", "mlp_out")), "resid_post")
        return cls(kind, site)
