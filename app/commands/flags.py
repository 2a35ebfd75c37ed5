"""What every command's parser shares: the parser class (argument errors in one line, exit 2), the help
format that shows each default, and the flags several commands take (capture, model, memory).

Cheap to import: the ``lens`` modules it loads (the facade, the settings' parts, the capture spec, the errors) load
no torch and no numpy; torch comes with a device check (:func:`device_arg` on a device other than "cpu")."""

from __future__ import annotations

import argparse
import dataclasses

import lens
from lens.capturing.settings import ModelSettings, TextSettings, flag_name
from lens.capturing.spec import CAPTURE_DEFAULTS
from lens.errors import LensInputError


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """``--help`` shows every option's default, unless its help already says it in words or there is none
    to show (a flag, an option that is off unless given); descriptions and epilogs keep their lines."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text.lower() or action.default is None or action.default is False or action.default == []:
            return text
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line, exit 2
        self.exit(2, f"lens: error: {message}\n")


def device_arg(text: str) -> str:
    """argparse type: a device that exists here (a bad one is exit 2 with one line, not a torch assertion)."""
    if text.strip() == "cpu":  # the default, converted by argparse on every parse: no torch for it
        return "cpu"
    from lens.runtime.devices import parse_device  # lazy: loads torch (a device other than "cpu" only)

    try:
        return parse_device(text)
    except LensInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def capture_defaults():
    """The capture defaults (:class:`lens.capturing.spec.CaptureSpec`), where the capture flags take theirs."""
    return CAPTURE_DEFAULTS


_KINDS = {"int": int, "device": device_arg, "list": None}  # a field's metadata "kind" -> the flag's argparse type


def add_setting_flags(p, part: type, names=None, help: dict | None = None) -> None:
    """One flag per field of ``part`` (a :mod:`lens.capturing.settings` part), in the order of ``names`` (default:
    every field that has a flag): its name, help, choices, type and default read from the field's metadata, said
    there once. ``help``: a field name -> the help a command says instead (where its meaning there is narrower)."""
    fields = {f.name: f for f in dataclasses.fields(part)}
    for name in names if names is not None else [n for n, f in fields.items() if flag_name(f)]:
        f = fields[name]
        meta = f.metadata
        default = ",".join(f.default) if meta.get("kind") == "list" else f.default
        kw = {"default": default, "help": (help or {}).get(name, meta["help"])}
        if meta.get("choices"):
            kw["choices"] = meta["choices"]
        if _KINDS.get(meta.get("kind")) is not None:
            kw["type"] = _KINDS[meta["kind"]]
        if meta.get("metavar"):
            kw["metavar"] = meta["metavar"]
        p.add_argument(flag_name(f), **kw)  # dest: the flag's name (--model-dtype -> model_dtype), as the commands read it


def settings_from_args(part: type, args, **given):
    """The ``part`` (a :mod:`lens.capturing.settings` part) that parsed ``args`` name: each field read from its
    flag's destination where the command has that flag, else its default; ``given`` overrides."""
    values = {}
    for f in dataclasses.fields(part):
        flag = flag_name(f)
        dest = flag[2:].replace("-", "_") if flag else None
        if dest is not None and hasattr(args, dest):
            values[f.name] = getattr(args, dest)
    return part(**{**values, **given})


def load_model_from_args(args, device=None, **more):
    """The model the command's flags name (``args.model``, ``--model-dtype``, ``--attn``), loaded as its plan says
    (:meth:`lens.capturing.settings.ModelSettings.resolve`: "auto" made concrete for ``device``, the attention and
    the device checked); ``more``: other :func:`lens.load_model` keywords (max_memory, offload_folder)."""
    plan = settings_from_args(ModelSettings, args, device=device).resolve()
    return lens.load_model(plan.name, device=plan.device, dtype=plan.dtype, attn_implementation=plan.attn, **more)


def add_capture_args(p):
    """The text's flags (:class:`lens.capturing.settings.TextSettings`, but its transform), the model's device,
    and --no-memory-check."""
    add_setting_flags(p, TextSettings, ("corpus", "max_tokens", "sample", "sample_seed", "seq_len", "batch_size"))
    add_setting_flags(p, ModelSettings, ("device",))
    add_memory_flag(p)


def add_memory_flag(p):
    p.add_argument("--no-memory-check", action="store_true",
                   help="load a model even when its weights look larger than the memory available")


def add_model_args(p):
    """How the model is loaded and run (not how a store keeps its arrays: that is the store's --dtype):
    :class:`lens.capturing.settings.ModelSettings`' dtype and attention."""
    add_setting_flags(p, ModelSettings, ("dtype", "attn"))


def describe_commands(sub) -> None:
    """``lens CMD --help`` opens with the line ``lens --help`` lists for CMD."""
    for choice in sub._choices_actions:
        parser = sub.choices[choice.dest]
        parser.description = parser.description or choice.help
