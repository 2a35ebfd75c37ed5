"""docs/findings.md's generator (studies/reporting/findings.py) on synthetic main jobs (tests/synthetic_runs.py and the main
job's own main_job.json writer): its verdicts are studies.reporting.headlines.judged's, a study that did not apply, failed
or is missing is a stated gap, and a folder that is not a main job is refused with exit 2 and one line."""

from __future__ import annotations

import json
import re
import shutil
import time

from studies.core.config import StudyConfig
from studies.core.contract import NOT_APPLICABLE, VERDICTS
from studies.reporting.findings import main
from studies.reporting.headlines import judged
from studies.job.rows import JobRow
from studies.job.main_job import FAILED, NOT_APPLICABLE as JOB_NA, OK, _write_job
from studies.core.registry import STUDIES
from studies.reporting.results import read_result
from tests.synthetic_runs import write_synthetic_run


def _job(out, model, statuses: dict) -> None:
    """main_job.json as `lens study all` writes it, with one row per study in ``statuses``."""
    rows = [JobRow(s, st, str(out / s), seconds=1.5,
                   error={OK: None, JOB_NA: "the model has no LM head", FAILED: "ValueError: boom"}[st])
            for s, st in statuses.items()]
    _write_job(out, StudyConfig(model=model, corpus="wiki-sample"), {}, rows, list(statuses), time.time() - 60, 2.0,
               finished=True)


def _sections(text: str) -> dict:
    """(study, measure) -> {checkpoint model id: row cells} from the per-claim tables."""
    out = {}
    for block in text.split("\n### ")[1:]:
        head, body = block.split("\n", 1)
        study, measure = head.split(": ", 1)
        rows = {}
        for line in body.splitlines():
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            if len(cells) == 6 and cells[0] not in ("checkpoint", "---"):
                rows[cells[0].split(" (")[0]] = cells
        out[(study, measure)] = rows
    return out


def test_findings_verdicts_are_judged_and_gaps_are_stated(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_synthetic_run(a, model="synth-a", seed=0)
    write_synthetic_run(b, model="synth-b", seed=1, n_layers=8)
    _job(a, "synth-a", {s: OK for s in STUDIES})
    # b: one study does not apply, one failed, one is said ok but its folder is gone, one never ran
    statuses = {s: OK for s in STUDIES if s != "filler-tokens"}
    statuses.update({"logit-lens": JOB_NA, "context-knob": FAILED})
    _job(b, "synth-b", statuses)
    shutil.rmtree(b / "senses")
    # one fit still drifts with the sample (b): its verdict is still judged's, marked unstable; a null (a)
    rec_file = b / "prediction-gains" / "result.json"
    rec = json.loads(rec_file.read_text())
    r = rec["summary"]["pearson_r_token_id"]
    rec["summary"].update({"nested__pearson_r_token_id": [r + 0.5, r + 0.2, r], "nested_n__pearson_r_token_id": [1, 2, 4],
                           "pearson_r_token_id_low": r - 0.002, "pearson_r_token_id_high": min(r + 0.002, -0.985)})
    rec_file.write_text(json.dumps(rec))
    rec_file = a / "linearity" / "result.json"
    rec = json.loads(rec_file.read_text())
    rec["summary"].update({"null__linearity_mean": 0.143, "null_p__linearity_mean": 0.05})
    rec_file.write_text(json.dumps(rec))

    out = tmp_path / "findings.md"
    assert main([str(a), str(b), "--out", str(out)]) == 0
    text = out.read_text()
    sections = _sections(text)
    assert "python -m studies.reporting.findings" in text and "code commit" in text and "CPU" in text
    assert "asks for at least 3 real checkpoints" in text  # two runs: the shortfall is stated

    judged_rows = 0
    for run, model in ((a, "synth-a"), (b, "synth-b")):
        for study in STUDIES:
            folder = run / study
            if not (folder / "result.json").is_file() or (run is b and study in ("logit-lens", "context-knob", "filler-tokens")):
                continue
            for j in judged(read_result(folder)):
                cells = sections[(study, j["measure"])][model]
                assert cells[5].split(":")[0].split(" (")[0] == j["verdict"], (study, j["measure"], model, cells)
                assert cells[2] == (j["interval"] or "—")
                judged_rows += 1
    assert judged_rows >= 12
    verdicts = {c[5].split(":")[0].split(" (")[0] for rows in sections.values() for c in rows.values()}
    assert verdicts & set(VERDICTS[:3]), verdicts  # real verdicts came through, not only gaps

    pg = sections[("prediction-gains", "Pearson r of log PR vs layer (paper's recipe)")]
    # nested subsamples (issue #37) replace the tokens-per-dimension rule: a drifting value is marked unstable
    assert pg["synth-a"][5].startswith("agrees") and "(unstable)" not in pg["synth-a"][3], pg
    assert pg["synth-b"][3].endswith("(unstable)") and "unstable" in pg["synth-b"][5], pg
    lin = sections[next(k for k in sections if k[0] == "linearity")]
    assert lin["synth-a"][4] == "0.143 (p = 0.050)" and "null p = 0.050" in lin["synth-a"][5], lin
    assert "| prediction-gains | Pearson r of log PR vs layer (paper's recipe) | agrees | " in text
    # the matrix shows each judged verdict's word, also where the verdict text goes on ("agrees (translators ...)")
    glance = text.split("## Verdicts at a glance")[1].split("## Each claim")[0]
    tuned = next(line for line in glance.splitlines() if line.startswith("| tuned-lens | smallest CE gain"))
    assert tuned.split(" | ")[2] == "agrees", tuned

    def gap(study):
        return {m: rows["synth-b"][5] for (s, m), rows in sections.items() if s == study}

    assert all(v == f"{NOT_APPLICABLE}: the model has no LM head" for v in gap("logit-lens").values())
    assert all(v.startswith("not measured: the study failed (ValueError: boom)") for v in gap("context-knob").values())
    assert all("the result cannot be read" in v for v in gap("senses").values()) and gap("senses")
    assert all(v == "not measured: the study is not in this main job" for v in gap("filler-tokens").values())
    assert gap("filler-tokens")


def test_findings_refuses_what_is_not_a_main_job(tmp_path, capsys):
    write_synthetic_run(tmp_path / "run", studies=["senses"])
    for folder in (tmp_path / "missing", tmp_path / "run", tmp_path / "run" / "senses"):
        assert main([str(folder), "--out", str(tmp_path / "f.md")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "is not a main-job results folder" in err, err
    (tmp_path / "run" / "main_job.json").write_text("[1, 2]")
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "f.md")]) == 2
    assert not (tmp_path / "f.md").exists()
