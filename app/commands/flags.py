"""What every command's parser shares: the parser class (argument errors in one line, exit 2), the help
format that shows each default, and the flags several commands take (capture, model, memory).

Cheap to import (no torch, no ``lens`` package at import time): the capture defaults and the device check are
read when a parser is built or an argument parsed."""

from __future__ import annotations

import argparse


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
    from lens.runtime.devices import parse_device
    from lens.errors import LensInputError

    try:
        return parse_device(text)
    except LensInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def capture_defaults():
    """The capture defaults (:class:`lens.capturing.spec.CaptureSpec`), where the capture flags take theirs."""
    from lens.capturing.spec import CAPTURE_DEFAULTS

    return CAPTURE_DEFAULTS


def add_capture_args(p):
    from lens.capturing.spec import LOAD_DEVICE

    spec = capture_defaults()
    p.add_argument("--corpus", default=spec.corpus, help="wiki-sample, lee, or a .txt / .jsonl file")
    p.add_argument("--max-tokens", type=int, default=spec.max_tokens, help="tokens of the corpus to run through the model")
    p.add_argument("--sample", default=spec.sample, choices=("spread", "first"),
                   help="which tokens a corpus larger than --max-tokens gives: spread (whole windows drawn from every "
                        "document in turn) or first (the documents in order until --max-tokens)")
    p.add_argument("--sample-seed", type=int, default=spec.sample_seed,
                   help="seed of a spread sample's random order of documents and windows")
    p.add_argument("--seq-len", type=int, default=spec.seq_len, help="tokens per window (the model reads each window alone)")
    p.add_argument("--batch-size", type=int, default=spec.batch_size, help="windows per forward pass")
    p.add_argument("--device", default=LOAD_DEVICE, type=device_arg, help="cpu or cuda")
    add_memory_flag(p)


def add_memory_flag(p):
    p.add_argument("--no-memory-check", action="store_true",
                   help="load a model even when its weights look larger than the memory available")


def add_model_args(p):
    """How the model is loaded and run (not how a store keeps its arrays: that is the store's --dtype)."""
    spec = capture_defaults()
    p.add_argument("--model-dtype", default=spec.model_dtype, choices=("auto", "float32", "bfloat16", "float16"),
                   help="dtype of the model's weights and forward pass (default auto: bfloat16 on CUDA, float32 "
                        "on CPU); recorded in the store and results")
    p.add_argument("--attn", default=spec.attn, choices=("eager", "sdpa"),
                   help="the model's attention implementation")


def describe_commands(sub) -> None:
    """``lens CMD --help`` opens with the line ``lens --help`` lists for CMD."""
    for choice in sub._choices_actions:
        parser = sub.choices[choice.dest]
        parser.description = parser.description or choice.help
