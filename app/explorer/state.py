"""The explorer's configured roots: from ``app/explorer/main.py``'s arguments, else the environment.

``streamlit run app/explorer/main.py -- --results R --stores S --store-device D`` sets them for the session; a
page script run on its own (tests, ``streamlit run app/explorer/views/x.py``) falls back to ``LENS_APP_RESULTS``
/ ``LENS_APP_STORES`` / ``LENS_APP_STORE_DEVICE`` and then to ``results`` / ``stores`` in the working
directory and ``cpu``. ``store_device`` is where the explorer holds the store layers it queries (the
Nearest tokens page); it is checked when a page first holds a layer there, not here.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

ENV_RESULTS = "LENS_APP_RESULTS"
ENV_STORES = "LENS_APP_STORES"
ENV_STORE_DEVICE = "LENS_APP_STORE_DEVICE"
_KEY = "lens_roots"


@dataclass(frozen=True)
class Roots:
    results: str
    stores: str
    store_device: str = "cpu"


def parse_args(argv) -> Roots:
    parser = argparse.ArgumentParser(prog="lens app", add_help=False)
    parser.add_argument("--results", default=None)
    parser.add_argument("--stores", default=None)
    parser.add_argument("--store-device", default=None)
    args, _ = parser.parse_known_args(list(argv))
    return Roots(results=str(Path(args.results or os.environ.get(ENV_RESULTS, "results")).resolve()),
                 stores=str(Path(args.stores or os.environ.get(ENV_STORES, "stores")).resolve()),
                 store_device=args.store_device or os.environ.get(ENV_STORE_DEVICE, "cpu"))


def set_roots(roots: Roots) -> None:
    st.session_state[_KEY] = roots


def get_roots() -> Roots:
    roots = st.session_state.get(_KEY)
    if roots is None:
        roots = parse_args([])
        st.session_state[_KEY] = roots
    return roots
