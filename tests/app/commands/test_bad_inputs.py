"""The bad-input table of issue 21, through the real command line (``python -m app`` in a fresh
interpreter): every case exits 2 with exactly one line on stderr, no traceback, and leaves nothing
half-written. Extends ``tests/studies/core/test_bad_input.py`` (issue 14's table, run in-process) with the
inputs the issue-21 campaign found still ending as internal errors: backwards or empty layer lists,
non-finite ``--param`` values, a bad ``--param`` inside ``study all``, ``--jobs 0``, ``--max-memory
0=lots``, a file where ``--out`` goes, names too long for the filesystem, damaged tokenizer and
safetensors files, JSON nested past Python's recursion limit; and full / read-only filesystems during
``lens study``, ``lens study all`` and ``lens report`` (in a user + mount namespace with small tmpfs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lens.store_harness import unshare_works

ROOT = Path(__file__).resolve().parents[3]
SMALL = ["--corpus", "lee", "--max-tokens", "200", "--quiet"]
STUDY = ["--model", "tiny-llama", *SMALL]
LONG = "n" * 300  # past NAME_MAX (255) of every Linux filesystem


def lens(*argv, env=None) -> subprocess.CompletedProcess:
    extra = env or {}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("LENS_DEBUG", None)  # only where a test asks for it
    env.update(extra)
    return subprocess.run([sys.executable, "-m", "app", *map(str, argv)], capture_output=True, text=True,
                          env=env, timeout=600)


def one_line(out: subprocess.CompletedProcess) -> str:
    """The single stderr line of a refused command (exit 2, no traceback)."""
    lines = out.stderr.splitlines()
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("lens: error: ") and "Traceback" not in out.stderr, out.stderr
    return lines[0]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> Path:
    """A real tiny model folder (tiny-llama saved with save_pretrained) damaged three ways, a file where a
    folder goes, and a .jsonl corpus whose value is nested 100000 deep."""
    import lens

    root = tmp_path_factory.mktemp("bad")
    m = lens.load_model("tiny-llama")
    good = root / "good"
    m.hf_model.save_pretrained(good)
    m.tokenizer.save_pretrained(good)
    for name, file, content in [("tok-garbage", "tokenizer.json", b"garbage{"),
                                ("tok-empty", "tokenizer.json", b"{}"),
                                ("st-garbage", "model.safetensors", b"\xff" * 8 + os.urandom(92))]:
        shutil.copytree(good, root / name)
        (root / name / file).write_bytes(content)
    (root / "a-file").write_text("not a folder")
    (root / "deep.jsonl").write_text('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    return root


# (id, argv with {bad} for the fixture's folder and {tmp} for the test's own, a fragment of the one line)
TABLE = [
    ("layers-backwards", ["capture", "tiny-llama", "--layers", "3-1", "--out", "{tmp}/x", *SMALL], "runs backwards"),
    ("layers-empty", ["capture", "tiny-llama", "--layers=", "--out", "{tmp}/x", *SMALL], "no layers selected"),
    ("param-inf", ["study", "linearity", *STUDY, "--param", "ridge=inf", "--out", "{tmp}/x"],
     "parameter ridge: expected a finite number, got 'inf'"),
    ("param-1e999-in-all", ["study", "all", *STUDY, "--param", "ridge=1e999", "--out", "{tmp}/x"],
     "parameter ridge: expected a finite number, got '1e999'"),
    ("param-bool", ["study", "linearity", *STUDY, "--param", "drop_special=maybe", "--out", "{tmp}/x"],
     "expected true or false"),
    ("precision-bogus-in-all", ["study", "all", "--only", "filler-tokens,linearity", *STUDY, "--param",
                                "precision=bogus", "--out", "{tmp}/x"],
     "filler-tokens: precision: expected one of auto, float32, bfloat16, got 'bogus'"),
    ("jobs-0", ["study", "all", *STUDY, "--jobs", "0", "--out", "{tmp}/x"], "--jobs: expected a positive number"),
    ("max-memory-lots", ["capture", "tiny-llama", "--device-map", "auto", "--max-memory", "0=lots", "--out",
                         "{tmp}/x", *SMALL], "max_memory for device 0: expected a size"),
    ("study-out-is-a-file", ["study", "linearity", *STUDY, "--out", "{bad}/a-file"], "expected a folder"),
    ("study-all-out-under-a-file", ["study", "all", *STUDY, "--out", "{bad}/a-file/x"], "a-file on the way"),
    ("report-of-a-file", ["report", "{bad}/a-file"], "is not a folder of results"),
    ("stats-out-under-a-file", ["stats", "tiny-llama", *SMALL, "--out", "{bad}/a-file/x"], "a-file on the way"),
    ("study-all-out-too-long", ["study", "all", *STUDY, "--out", "{tmp}/" + LONG],
     "the name is longer than the filesystem allows"),
    ("study-out-too-long", ["study", "linearity", *STUDY, "--out", "{tmp}/" + LONG + "/r"],
     "the name is longer than the filesystem allows"),
    ("tokenizer-garbage", ["capture", "{bad}/tok-garbage", "--out", "{tmp}/x", *SMALL], "tokenizer"),
    ("tokenizer-empty-object", ["capture", "{bad}/tok-empty", "--out", "{tmp}/x", *SMALL], "tokenizer"),
    ("safetensors-garbage", ["capture", "{bad}/st-garbage", "--out", "{tmp}/x", *SMALL], "safetensors"),
    ("jsonl-nested-100000-deep", ["capture", "tiny-llama", "--corpus", "{bad}/deep.jsonl", "--max-tokens", "100",
                                  "--quiet", "--out", "{tmp}/x"], ""),
]


def _in_process(capsys, argv) -> subprocess.CompletedProcess:
    """``app.commands.cli.main`` in this process: the console script's code path minus interpreter start-up (the
    table would take minutes of fresh interpreters on a loaded 2-core machine); a sample of the cases
    runs in fresh interpreters below."""
    from app.commands.cli import main

    capsys.readouterr()
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's own refusals
        rc = exc.code
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(argv, rc, captured.out, captured.err)


def _argv(argv, bad: Path, tmp: Path) -> list[str]:
    return [a.replace("{bad}", str(bad)).replace("{tmp}", str(tmp)) for a in argv]


@pytest.mark.parametrize("case,argv,want", TABLE, ids=[c[0] for c in TABLE])
def test_bad_input_table(case, argv, want, bad_files, tmp_path, capsys, monkeypatch):
    """Exit 2, one line, no traceback, nothing made under --out's folder, the damaged files untouched."""
    monkeypatch.delenv("LENS_DEBUG", raising=False)
    out = _in_process(capsys, _argv(argv, bad_files, tmp_path))
    assert want in one_line(out)
    assert not list(tmp_path.iterdir()), f"left behind: {list(tmp_path.rglob('*'))}"
    assert (bad_files / "a-file").read_text() == "not a folder"


FRESH = ["layers-backwards", "study-all-out-too-long", "tokenizer-garbage"]


def test_a_sample_of_the_table_in_fresh_interpreters(bad_files, tmp_path):
    """python -m app as a user runs it: the same one line as in-process, on stderr, exit 2."""
    for case, argv, want in [c for c in TABLE if c[0] in FRESH]:
        (tmp_path / case).mkdir()
        assert want in one_line(lens(*_argv(argv, bad_files, tmp_path / case))), case
        assert not list((tmp_path / case).iterdir()), case


def test_bad_param_in_study_all_reads_as_in_a_single_study(tmp_path):
    alone = one_line(lens("study", "filler-tokens", *STUDY, "--param", "precision=bogus", "--out", tmp_path / "a"))
    in_all = one_line(lens("study", "all", "--only", "filler-tokens,linearity", *STUDY, "--param", "precision=bogus",
                           "--out", tmp_path / "b"))
    assert alone == in_all and "filler-tokens: precision" in alone
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_lens_debug_still_shows_the_traceback(tmp_path):
    out = lens("study", "all", *STUDY, "--out", tmp_path / ("n" * 300), env={"LENS_DEBUG": "1"})
    assert out.returncode == 2 and "Traceback" in out.stderr and "lens: error: " in out.stderr


def test_a_site_named_twice_is_captured_once(tmp_path):
    out = lens("capture", "tiny-llama", "--sites", "resid_post,resid_post", "--layers", "0,1", "--out",
               tmp_path / "s", *SMALL)
    assert out.returncode == 0, out.stderr
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["sites"] == {"resid_post": [0, 1]} and manifest["n_tokens"] == 200


def test_context_knob_is_not_applicable_to_a_model_that_knows_no_facts(tmp_path):
    """A random tiny model names no capital: the knob study is n/a with the reason, not failed."""
    from studies.job.rows import Status
    from studies.job.main_job import run_all

    base = {"model": "tiny-llama", "corpus": "lee", "max_tokens": 200, "seq_len": 128, "batch_size": 8,
            "device": "cpu", "store": None, "seed": 0, "progress": False}
    rows = run_all(base, tmp_path / "job", only="context-knob", params={"max_facts": "12"}, progress=False, jobs=1)
    assert [r["status"] for r in rows] == [Status.NOT_APPLICABLE], rows
    assert "names the capital of only 0 of 12 countries" in rows[0]["line"]
    job = json.loads((tmp_path / "job" / "main_job.json").read_text())
    assert job["studies"][0]["status"] == "n/a"
    # too few facts asked for is the settings' fault, not the model's: bad input
    from lens.errors import ModelLacks
    from studies.core.config import config_from_dict
    from studies.context_knob.study import Config, STUDY as KNOB
    from studies.core.runner import run_study

    with pytest.raises(Exception) as refused:
        run_study(KNOB, config_from_dict(Config, {**base, "max_facts": "5", "progress": False}), tmp_path / "k")
    assert "max_facts" in str(refused.value) and not isinstance(refused.value, ModelLacks)


def _listing(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_results_never_go_into_a_store_folder(tmp_path, capsys, monkeypatch):
    """A results folder that is a store, lies inside one (its shards/ too: ``--resume`` cleans that
    folder), or lies inside the folder ``--store`` is about to capture into: exit 2 naming the store,
    before any work, the store untouched and no new folder made."""
    import lens

    monkeypatch.delenv("LENS_DEBUG", raising=False)
    store = tmp_path / "store"
    lens.capture(lens.load_model("tiny-llama"), corpus="lee", out=store, max_tokens=200, progress=False)
    before = _listing(store)
    for argv, want in [
            (["study", "linearity", *STUDY, "--store", store, "--out", store], f"is the activation store {store}"),
            (["study", "linearity", *STUDY, "--store", store, "--out", store / "shards" / "r"],
             f"lies inside the activation store {store}"),
            (["study", "all", *STUDY, "--out", store], f"is the activation store {store}"),
            (["stats", "tiny-llama", *SMALL, "--out", store], f"is the activation store {store}"),
            (["study", "linearity", *STUDY, "--store", tmp_path / "new", "--out", tmp_path / "new" / "r"],
             f"lies inside the folder --store captures into, {tmp_path / 'new'}")]:
        assert want in one_line(_in_process(capsys, argv)), argv
        assert _listing(store) == before and not (tmp_path / "new").exists()
    # a job on another model, or other model settings, than the store it is given or finds in --out: refused
    # before main_job.json is written (every study would have captured a store of its own instead)
    job = tmp_path / "job"
    job.mkdir()
    (job / "store").symlink_to(store, target_is_directory=True)
    for argv, want in [
            (["study", "all", "--model", "tiny-gpt2", *SMALL, "--store", store, "--out", tmp_path / "other"],
             f"store {store} was captured from 'tiny-llama', but this job runs 'tiny-gpt2': pass a store"),
            (["study", "all", "--model", "tiny-gpt2", *SMALL, "--out", job], "choose another --out"),
            (["study", "all", *STUDY, "--model-dtype", "bfloat16", "--out", job],
             "captured with the model in float32, but this job runs it in bfloat16"),
            # OUT/store of an earlier job drew another sample of the corpus: not this job's to resume
            (["study", "all", *STUDY, "--sample-seed", "7", "--out", job],
             "holds the spread (seed 0) sample of its corpus, but this job draws the spread (seed 7) sample")]:
        assert want in one_line(_in_process(capsys, argv)), argv
        assert not (tmp_path / "other").exists() and [p.name for p in job.iterdir()] == ["store"]
    # the layout lens study all makes (the store inside the results folder) stays allowed
    from studies.reporting.results import require_results_folder

    require_results_folder(tmp_path / "results", tmp_path / "results" / "store")
    # and so does a project folder that has a manifest.json of its own beside a shards/ folder (a dataset's)
    project = tmp_path / "project"
    (project / "shards").mkdir(parents=True)
    (project / "manifest.json").write_text('{"format": "webdataset", "shards": 12}')
    require_results_folder(project / "results")


def test_an_unusable_cache_folder_is_named_with_the_variable_that_set_it(tmp_path, monkeypatch):
    from lens.errors import LensInputError
    from lens.runtime.cache import cache_dir

    (tmp_path / "a-file").write_text("x")
    for var, want in [("LENS_CACHE_DIR", f"cache folder {tmp_path / 'a-file'} (from LENS_CACHE_DIR) cannot be made"),
                      ("XDG_CACHE_HOME", "(from XDG_CACHE_HOME) cannot be made: Not a directory")]:
        monkeypatch.delenv("LENS_CACHE_DIR", raising=False)
        monkeypatch.setenv(var, str(tmp_path / "a-file"))
        with pytest.raises(LensInputError, match=want.replace("(", r"\(").replace(")", r"\)")):
            cache_dir()
    # through the command line, in a fresh interpreter (nothing cached in this process stands in for it)
    out = lens("capture", "smollm2-135m", "--max-tokens", "50", "--quiet", "--out", tmp_path / "s",
               env={"LENS_CACHE_DIR": str(tmp_path / "a-file")})
    assert "(from LENS_CACHE_DIR) cannot be made" in one_line(out) and not (tmp_path / "s").exists()


def test_app_binds_with_allowed_hosts():
    """lens app hands Streamlit server.allowedHosts for the address it binds (the live refusal of a
    foreign Host is checked in tests/app/commands/test_cli.py's lens app test)."""
    from app.explorer.launch import allowed_hosts, command

    def hosts(cmd):
        return [cmd[i + 1] for i, a in enumerate(cmd) if a == "--server.allowedHosts"]

    assert hosts(command("r", "s")) == ["localhost", "127.0.0.1", "::1"]
    assert hosts(command("r", "s", host="10.0.0.7", allow_hosts=["lens.example.org"])) == ["10.0.0.7", "lens.example.org"]
    assert "localhost" in allowed_hosts("0.0.0.0") and "evil.example" not in allowed_hosts("0.0.0.0")
    # the option name exists in the installed Streamlit (a renamed option would be ignored with a warning)
    from streamlit import config

    assert config.get_option("server.allowedHosts") == []


@pytest.mark.skipif(not unshare_works(), reason="cannot mount a tmpfs in a user + mount namespace here")
def test_full_and_read_only_filesystems(tmp_path):
    """A full disk and a read-only filesystem during lens report, lens study and lens study all: exit 2,
    one line naming the file and what to do, no .tmp (nothing half-written), the finished results that
    were there before byte-identical."""
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("LENS_HTML_CDN", None)  # the report inlines plotly.js (~4 MB): it must not fit the full disk
    env.pop("LENS_DEBUG", None)
    run = subprocess.run(["unshare", "-rm", sys.executable, str(Path(__file__).with_name("bad_env_probe.py")),
                          str(tmp_path), str(report)], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    results = {r["scenario"]: r for r in json.loads(report.read_text())}
    assert len(results) == 6
    for name, r in results.items():
        lines = r["stderr"].splitlines()
        assert r["rc"] == 2 and len(lines) == 1 and "Traceback" not in r["stderr"], r
        want = "the disk is full" if "full" in name else "the filesystem is read-only"
        assert lines[0].startswith("lens: error: /") and want in lines[0], r
        assert not [f for f in r["files"] if ".tmp" in f], r  # nothing half-written
        assert r["finished_before"] == r["finished_after"], r  # the earlier results are intact
    assert "--resume" in results["study all, disk full"]["stderr"]
    assert "report.html" in results["report, disk full"]["stderr"]
    full = results["study all, disk full"]["files"]
    assert "job/linearity/result.json" not in full  # the study that could not be written is not complete
    assert "job/earlier/linearity/result.json" in full
