"""result.json and main_job.json as frozen values (issue #41): parsed and checked once (from_dict), written back key
for key (to_dict); an older file reads as it did; a malformed one is one line naming the file and what was expected."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lens.errors import LensInputError
from studies.core.axis import AxisKind, LayerAxis
from studies.reporting.result_file import RESULT_FILE, ResultFile
from studies.job.rows import JOB_FILE, MainJobRecord
from studies.reporting.results import read_result, write_result


def _written(tmp_path, **kw):
    out = write_result(tmp_path / "r", study="anisotropy", model="tiny-llama", corpus="lee", n_tokens=100,
                       config={"site": "resid_post"}, layers=[0, 1, 2], metrics={"cos": [0.5, float("nan"), 0.25]},
                       summary={"peak": 0.5}, **kw)
    return out / RESULT_FILE


def test_a_written_result_round_trips_byte_for_byte(tmp_path):
    file = _written(tmp_path, layer_axis={"kind": "block", "site": "resid_mid", "note": ""})
    raw = file.read_text()
    value = ResultFile.read(file)
    assert json.dumps(value.to_dict(), indent=1) == raw
    assert value.layers == (0, 1, 2) and value.metrics["cos"] == [0.5, None, 0.25] and value.n_tokens == 100
    assert value.layer_axis == LayerAxis(AxisKind.BLOCK, "resid_mid", "")
    assert list(json.loads(raw)) == ["schema_version", "study", "model", "corpus", "n_tokens", "config", "versions",
                                     "git_revision", "created", "wall_time_s", "layers", "metrics", "summary",
                                     "extra", "layer_axis"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        value.study = "x"  # type: ignore[misc]
    with pytest.raises(TypeError, match="frozen value"):
        value.summary["peak"] = 1  # type: ignore[index]
    record = read_result(file.parent)  # the folder as the explorer, the report and the headlines read it
    assert record.metrics == {"cos": [0.5, None, 0.25]} and record.layer_axis == value.layer_axis
    record.metrics["cos"].append(1)  # plain containers, a copy: the value is untouched
    assert value.metrics["cos"] == [0.5, None, 0.25]


def test_an_older_result_reads_as_it_did_and_writes_back_unchanged(tmp_path):
    old = {"study": "anisotropy", "model": "m", "layers": [0, 1], "metrics": {"a": [1, 2]}, "summary": {},
           "written_by": "an older version"}
    value = ResultFile.from_dict(old)
    assert value.layer_axis is None and value.corpus == "" and value.n_tokens == 0 and value.schema_version is None
    assert json.dumps(value.to_dict()) == json.dumps(old)  # nothing added, the unknown field kept
    half = {**old, "layer_axis": {"kind": "transition", "site": "resid_post"}}  # no note: read as LayerAxis does
    value = ResultFile.from_dict(half)
    assert value.layer_axis == LayerAxis.from_dict(half["layer_axis"])
    assert json.dumps(value.to_dict()) == json.dumps(half)
    foreign = {**old, "layer_axis": ["not", "an", "axis"]}
    assert ResultFile.from_dict(foreign).layer_axis is None and ResultFile.from_dict(foreign).to_dict() == foreign


@pytest.mark.parametrize("text,expected", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "is not a result record: expected a JSON object, got list"),
    ('{"study": "a", "model": "m", "layers": [0]}', "lacks metrics, summary"),
    ('{"study": "a", "model": "m", "layers": [0], "metrics": {"x": [1, 2]}, "summary": {}}',
     "metric 'x' must hold one value per layer (1), got 2 values"),
    ('{"study": "a", "model": "m", "layers": ["0"], "metrics": {}, "summary": {}}', "layers must be a list of layer"),
])
def test_a_malformed_result_is_one_line_naming_the_file(tmp_path, text, expected):
    (tmp_path / RESULT_FILE).write_text(text)
    with pytest.raises(LensInputError) as info:
        read_result(tmp_path)
    message = str(info.value)
    assert message.startswith(str(tmp_path / RESULT_FILE)) and expected in message and "\n" not in message


JOB = {"model": "tiny-llama", "corpus": "lee", "max_tokens": 2000, "store": "results/store", "capture_s": 1.5,
       "wall_time_s": 10.25, "jobs": 1, "studies": [
           {"study": "anisotropy", "status": "ok", "seconds": 2.0, "out": "r/anisotropy", "line": "x", "error": None},
           {"study": "probes", "status": "running", "seconds": None, "out": "r/probes", "line": "", "error": None,
            "started": 1.0, "estimate_s": 3.0}],
       "params": {"seed": "0"}, "machine": "cpu", "cpu_features": ["avx2"], "finished": None, "stopped": None}


def test_main_job_record_round_trips_and_reads_by_attribute(tmp_path):
    file = tmp_path / JOB_FILE
    file.write_text(json.dumps(JOB, indent=1))
    job = MainJobRecord.read(file)
    assert json.dumps(job.to_dict(), indent=1) == file.read_text()
    assert job.model == "tiny-llama" and job.max_tokens == 2000 and job.finished is None and job.has_studies
    assert list(job.rows) == ["anisotropy", "probes"] and job.rows["probes"]["estimate_s"] == 3.0
    with pytest.raises(TypeError, match="frozen value"):
        job.rows["anisotropy"]["status"] = "failed"  # type: ignore[index]
    old = {"studies": [{"study": "a", "status": "ok"}, "not a row"], "written_by": "older"}  # fields missing/unknown
    job = MainJobRecord.from_dict(old)
    assert job.model is None and job.row_list() == [{"study": "a", "status": "ok"}]
    assert json.dumps(job.to_dict()) == json.dumps(old)


@pytest.mark.parametrize("text,expected", [
    ("{not json", "is not JSON"),
    ("[]", "expected a JSON object, got list"),
    ('{"studies": {"a": 1}}', "studies must be a list, got dict"),
    ('{"studies": [], "wall_time_s": "long"}', "wall_time_s must be int or float or null, got str"),
])
def test_a_malformed_main_job_is_one_line_naming_the_file(tmp_path, text, expected):
    (tmp_path / JOB_FILE).write_text(text)
    with pytest.raises(LensInputError) as info:
        MainJobRecord.read(tmp_path / JOB_FILE)
    assert str(info.value).startswith(str(tmp_path / JOB_FILE)) and expected in str(info.value)
    assert "\n" not in str(info.value)
