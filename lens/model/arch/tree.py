"""The module tree: the list of blocks, the modules inside a block and around it, and what role a module
plays (attention, MLP, mixer, norm) by its name or class name (:mod:`lens.model.arch.names`)."""

from __future__ import annotations

from torch import nn

from lens.errors import LensInputError
from lens.model.arch import names as N

MAX_DEPTH = 3  # how deep inside a block candidate modules are looked for


def find_block_list(model: nn.Module, n_layers: int) -> str:
    """Path of the ModuleList of ``n_layers`` blocks (the text model's in a multimodal model)."""
    found = [(name, mod) for name, mod in model.named_modules()
             if isinstance(mod, nn.ModuleList) and len(mod) == n_layers and name]
    # drop lists nested inside another candidate's blocks (per-layer sub-lists)
    found = [(n, m) for n, m in found if not any(n != o and n.startswith(o + ".") for o, _ in found)]
    if not found:
        raise LensInputError(
            f"{getattr(model.config, 'model_type', '?')} ({type(model).__name__}): no ModuleList of "
            f"num_hidden_layers={n_layers} blocks in its module tree, so no site can be mapped "
            "(shared or looped layers are not supported)")

    def rank(item):
        name = item[0]
        other_modality = any(w in name for w in ("vision", "audio", "image", "visual", "speech"))
        return (other_modality, "encoder" in name and "decoder" not in name and _has_decoder(model), name.count("."))

    return sorted(found, key=rank)[0][0]


def has_list_of(model: nn.Module, n: int) -> bool:
    """Whether the module tree holds a ``ModuleList`` of ``n`` entries (a candidate list of ``n`` blocks)."""
    return any(isinstance(mod, nn.ModuleList) and len(mod) == n and name for name, mod in model.named_modules())


def _has_decoder(model) -> bool:
    return any(n.endswith("decoder") for n, _ in model.named_children())


def parent_path(path: str) -> str:
    return path.rpartition(".")[0]


def class_name(module: nn.Module) -> str:
    return type(module).__name__


def is_norm(module: nn.Module) -> bool:
    """A normalisation module: ``nn.LayerNorm`` or a class named ``...Norm`` (``GemmaRMSNorm``,
    ``MambaRMSNormGated``) — not ``RobertaPreLayerNormAttention``, which only has it in its family name."""
    cls = class_name(module)
    if isinstance(module, (nn.LayerNorm, nn.GroupNorm)):
        return True
    # DBRX's ``DbrxNormAttentionNorm`` ends in "Norm" but holds the attention between its two norms
    return any(cls.endswith(p) for p in N.NORM_CLASS_SUFFIXES) and not any(p in cls for p in N.ATTENTION_CLASS_PARTS)


def child_role(name: str, module: nn.Module) -> str:
    """attention / mlp / mixer / norm / other, from the child's name, then its class name."""
    if is_norm(module):
        return "norm"
    if name in N.ATTENTION_NAMES and name not in N.MIXER_NAMES:
        return "attention"
    if name in N.MLP_NAMES:
        return "mlp"
    if name in N.MIXER_NAMES:
        return "mixer"
    cls = class_name(module)
    if any(p in cls for p in N.MIXER_CLASS_PARTS):
        return "mixer"
    if any(p in cls for p in N.ATTENTION_CLASS_PARTS):
        return "attention"
    if any(p in cls for p in N.MLP_CLASS_PARTS):
        return "mlp"
    return "other"


def descendants(block: nn.Module, depth: int = MAX_DEPTH) -> list[str]:
    out = []
    for name, _ in block.named_modules():
        if name and name.count(".") < depth:
            out.append(name)
    return out


def modules_around(model: nn.Module, path: str) -> list[str]:
    """Children of every ancestor of ``path`` (the final norm may sit in the base model, in an encoder
    wrapper, or beside it), except the ancestors themselves."""
    parts = path.split(".")
    ancestors = [".".join(parts[:i]) for i in range(len(parts))]
    out = []
    for anc in ancestors:
        mod = model.get_submodule(anc) if anc else model
        if isinstance(mod, nn.ModuleList):  # the other blocks
            continue
        for name, _ in mod.named_children():
            child = f"{anc}.{name}" if anc else name
            if child not in ancestors and not path.startswith(child + "."):
                out.append(child)
    return out
