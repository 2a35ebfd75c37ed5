"""A model too large for one device: split across devices (and host memory, and disk) by accelerate.

``lens.load_model(spec, device_map="auto", max_memory={0: "70GiB", "cpu": "200GiB"},
offload_folder="offload/")`` hands the placement to the existing engine rather than a home-made one:
models loaded with ``from_pretrained`` (hub ids, model folders, GGUF caches) get ``device_map`` /
``max_memory`` / ``offload_folder`` passed straight through; models built in memory (the tiny models, a
module handed in) are dispatched after they are built with accelerate's ``infer_auto_device_map`` and
``dispatch_model``. Either way the model carries ``hf_device_map`` (module -> device, ``"disk"`` for
weights read from ``offload_folder`` at each forward) and accelerate's hooks move each module's inputs
to its device, so the capture hooks see every layer's states on that layer's device.

``device_map`` is ``"auto"``, ``"balanced"``, ``"balanced_low_0"``, ``"sequential"`` or a dict
(module name -> ``"cpu"``, ``"disk"``, ``"cuda:N"`` or ``N``); ``max_memory`` a dict (device ->
bytes or ``"10GiB"``) or the command line's ``0=70GiB,cpu=200GiB``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lens.errors import LensInputError

DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


@dataclass(frozen=True)
class Placement:
    device_map: "str | dict"
    max_memory: dict | None = None
    offload_folder: str | None = None

    def pretrained_kwargs(self) -> dict:
        """Keyword arguments for ``from_pretrained`` (accelerate places the weights as they load)."""
        kw = {"device_map": self.device_map}
        if self.max_memory is not None:
            kw["max_memory"] = self.max_memory
        if self.offload_folder is not None:
            kw["offload_folder"] = self.offload_folder
        return kw


def parse_max_memory(spec) -> dict | None:
    """``{0: "10GiB", "cpu": "30GiB"}`` or ``"0=10GiB,cpu=30GiB"`` -> a dict accelerate takes."""
    if spec is None or isinstance(spec, dict):
        out = spec
    else:
        out = {}
        for item in str(spec).split(","):
            key, sep, value = item.strip().partition("=")
            if not sep or not key.strip() or not value.strip():
                raise LensInputError(f"--max-memory expects DEVICE=SIZE,... (for example 0=70GiB,cpu=100GiB), "
                                     f"got {spec!r}")
            out[key.strip()] = value.strip()
    if out is None:
        return None
    parsed = {}
    for key, value in out.items():
        key = int(key) if isinstance(key, str) and key.isdigit() else key
        if isinstance(key, str) and key.startswith("cuda:") and key[5:].isdigit():
            key = int(key[5:])
        if not (isinstance(key, int) or key in ("cpu", "disk", "mps")):
            raise LensInputError(f"max_memory names device {key!r}: expected a GPU index (0, 1, ...), cpu or disk")
        parsed[key] = _memory_size(key, value)
    return parsed


def _memory_size(device, value):
    """A size accelerate understands (bytes, or a number with a unit: 70GiB, 5.0GB), checked here so that
    ``0=lots`` is one line naming it, not accelerate's ValueError deep in the load."""
    from accelerate.utils import convert_file_size_to_int  # lazy: undeclared (via transformer-lens)

    if isinstance(value, str) and value.strip().isdigit():  # bytes: accelerate takes those as an int
        value = int(value)
    try:
        size = convert_file_size_to_int(value)
    except (ValueError, TypeError):
        size = None
    if size is None or isinstance(size, bool) or size < 0:
        raise LensInputError(f"max_memory for device {device}: expected a size such as 70GiB, 500MB or a number "
                             f"of bytes, got {value!r}")
    return value


def make_placement(device, device_map, max_memory, offload_folder) -> Placement | None:
    """The placement asked for, refused when it contradicts itself (``None`` when none is asked for)."""
    if device_map is None:
        if max_memory is not None or offload_folder is not None:
            raise LensInputError("max_memory / offload_folder need device_map (for example device_map='auto')")
        return None
    if device is not None:
        raise LensInputError(f"pass device ({device!r}) or device_map ({device_map!r}), not both: a device_map "
                             "places every module itself")
    if isinstance(device_map, str) and device_map not in DEVICE_MAPS:
        raise LensInputError(f"unknown device_map {device_map!r}: expected {', '.join(DEVICE_MAPS)} or a dict "
                             "(module name -> device)")
    if not isinstance(device_map, (str, dict)):
        raise LensInputError(f"device_map must be a name or a dict, got {type(device_map).__name__}")
    return Placement(device_map, parse_max_memory(max_memory), None if offload_folder is None else str(offload_folder))


def dispatch(model: torch.nn.Module, place: Placement) -> torch.nn.Module:
    """Split a model already built in memory by ``place`` (accelerate's own planning and hooks)."""
    from accelerate import dispatch_model, infer_auto_device_map  # lazy: undeclared (via transformer-lens)
    from accelerate.utils import get_balanced_memory  # lazy: undeclared (via transformer-lens)

    device_map = place.device_map
    if isinstance(device_map, str):
        no_split = getattr(model, "_no_split_modules", None) or []
        max_memory = place.max_memory
        if device_map != "sequential":
            max_memory = get_balanced_memory(model, max_memory=max_memory, no_split_module_classes=no_split,
                                             low_zero=device_map == "balanced_low_0")
        device_map = infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split)
    if "disk" in device_map.values() and place.offload_folder is None:
        raise LensInputError("the device_map offloads modules to disk: give offload_folder (--offload-folder DIR)")
    model = dispatch_model(model, device_map=device_map, offload_dir=place.offload_folder)
    model.hf_device_map = dict(device_map)
    return model


def is_dispatched(model: torch.nn.Module) -> bool:
    """Whether accelerate placed the model's modules (then ``.to(device)`` must not move it)."""
    return bool(getattr(model, "hf_device_map", None))


def input_device(model: torch.nn.Module) -> torch.device:
    """Where a batch goes in: the device of the first parameter that holds its weights (offloaded ones
    are on the meta device until their module runs); accelerate's hooks move inputs on from there."""
    for p in model.parameters():
        if not p.is_meta:
            return p.device
    return torch.device("cpu")


__all__ = ["Placement", "parse_max_memory", "make_placement", "dispatch", "is_dispatched", "input_device"]
