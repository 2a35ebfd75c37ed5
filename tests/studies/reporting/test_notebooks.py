"""The notebooks: generated from make_notebooks.py, committed with the outputs of a run (a PNG beside each plotly
figure, for viewers that run no JavaScript), and run top to bottom here (nbclient, the venv's python3 kernel,
cwd = repo root) without an error or a warning."""

from __future__ import annotations

import base64
import importlib.util
import struct
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
NOTEBOOKS = sorted((ROOT / "studies" / "notebooks").glob("*.ipynb"))
REAL_MODEL = {"quickstart", "probing_hypothesis"}  # notebooks that run the packaged SmolLM2-135M


def _make():
    spec = importlib.util.spec_from_file_location("make_notebooks", ROOT / "studies" / "notebooks" / "make_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    return struct.unpack(">II", png[16:24])


def test_notebooks_exist():
    assert {p.name for p in NOTEBOOKS} >= {"quickstart.ipynb", "probing_hypothesis.ipynb", "custom_analysis.ipynb"}


def test_notebooks_match_their_source():
    """The .ipynb files are generated from make_notebooks.py: they must not drift apart."""
    import nbformat

    for name, cells in _make().NOTEBOOKS.items():
        nb = nbformat.read(ROOT / "studies" / "notebooks" / name, as_version=4)
        assert [c.source for c in nb.cells] == [src for _, src in cells], name


def test_committed_notebooks_hold_the_outputs_of_a_run():
    """Every code cell ran, top to bottom in one kernel, without an error or a warning; every plotly figure carries
    a PNG of its own size and no HTML form (a static viewer would show that blank)."""
    import nbformat

    mod = _make()
    figures = 0
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), f"{path.name}: not run in order"
        bad = [o for c in code for o in c.outputs if o.output_type == "error" or o.get("name") == "stderr"]
        assert not bad, f"{path.name}: {bad[0]}"
        for out in mod.figure_outputs(nb):
            layout = out.data[mod.PLOTLY].get("layout", {})
            assert "image/png" in out.data and "text/html" not in out.data, path.name
            assert _png_size(base64.b64decode(out.data["image/png"])) == (layout.get("width") or 700,
                                                                            layout.get("height") or 450)
            figures += 1
    assert figures >= 3


def test_a_static_png_is_the_figure_drawn_by_plotly():
    """render_pngs draws with plotly.js in headless Chromium: a figure filled by one colour comes back that colour
    at its centre, at the layout's size."""
    from PIL import Image
    import io

    if not Path(_make().CHROMIUM).exists():
        pytest.skip("no Chromium at /usr/bin/chromium (scripts/system_deps.sh installs it)")
    fig = {"data": [{"type": "heatmap", "z": [[1, 1], [1, 1]], "colorscale": [[0, "rgb(200,30,40)"], [1, "rgb(200,30,40)"]],
                     "showscale": False}],
           "layout": {"width": 320, "height": 240, "margin": {"l": 0, "r": 0, "t": 0, "b": 0},
                      "xaxis": {"visible": False}, "yaxis": {"visible": False}}}
    (png,) = _make().render_pngs([fig])
    img = Image.open(io.BytesIO(png)).convert("RGB")
    assert img.size == (320, 240) and img.getpixel((160, 120)) == (200, 30, 40)


@pytest.mark.parametrize("path", [pytest.param(p, marks=[pytest.mark.slow, pytest.mark.timeout(900)]
                                               if p.stem in REAL_MODEL else [])
                                  for p in NOTEBOOKS], ids=lambda p: p.stem)
def test_notebook_executes(path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    for key, value in _make().KERNEL_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    nb = nbformat.read(path, as_version=4)
    # a cell that loads SmolLM2 and captures 2000 tokens takes ~20 s on a quiet 2-core machine, minutes on a shared one
    timeout = 600 if path.stem in REAL_MODEL else 180
    client = NotebookClient(nb, kernel_name="python3", timeout=timeout, resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    warned = [o.text for o in outputs if o.output_type == "stream" and o.name == "stderr"]
    assert not warned, warned  # no warning (tqdm's "IProgress not found" opened every notebook)
