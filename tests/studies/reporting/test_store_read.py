"""One answer to "is this folder a store?" (lens.store.layout.is_store) and to "which store did this result
read?" (studies.reporting.results.store_read): the report, findings.md and the explorer ask these two."""

from pathlib import Path

from lens.store.layout import MANIFEST, is_store
from studies.reporting.results import store_candidates, store_read


def test_a_folder_with_a_manifest_is_a_store_even_damaged(tmp_path):
    assert not is_store(tmp_path) and not is_store(None)
    (tmp_path / MANIFEST).write_text("{not json")  # damaged: reading it says so, it is not an empty folder
    assert is_store(tmp_path)


def test_the_recorded_path_then_its_last_components_under_the_run(tmp_path):
    run = tmp_path / "moved" / "smol"
    assert store_candidates(None, run) == [] and store_read("", run) is None
    assert store_candidates("/old/machine/results/smol/store", run) == [
        Path("/old/machine/results/smol/store"), run / "results/smol/store", run / "smol/store", run / "store"]
    (run / "store").mkdir(parents=True)
    assert store_read("/old/machine/results/smol/store", run) is None  # no manifest: not a store
    (run / "store" / MANIFEST).write_text("{}")
    assert store_read("/old/machine/results/smol/store", run) == run / "store"
