"""The command line end to end: exit codes 0 / 2, one-line messages, nothing overwritten."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def lens_cli(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "app", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=600)


def test_models_and_corpora_listings():
    out = lens_cli("models")
    assert out.returncode == 0 and "smollm2-135m" in out.stdout and "installed" in out.stdout
    out = lens_cli("corpora")
    assert out.returncode == 0 and "wiki-sample" in out.stdout and "lee" in out.stdout


def test_capture_and_store_info(tmp_path):
    out = lens_cli("capture", "tiny-llama", "--corpus", "lee", "--max-tokens", "300", "--out", tmp_path / "s",
                   "--sites", "resid_post,attn_out", "--layers", "0,3", "--dtype", "float16", "--quiet")
    assert out.returncode == 0, out.stderr
    info = lens_cli("store", "info", tmp_path / "s", "--json")
    assert info.returncode == 0
    data = json.loads(info.stdout)
    assert data["manifest"]["n_tokens"] == 300 and data["manifest"]["sites"] == {"resid_post": [0, 3], "attn_out": [0, 3]}
    assert len(data["layers"]) == 4


_capsys = None


def _bad(*args):
    """In-process (same code path as the console script, minus the interpreter start-up)."""
    from app.commands.cli import main

    _capsys.readouterr()
    rc = main([str(a) for a in args])
    err = _capsys.readouterr().err
    assert rc == 2, (rc, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lens: error:") and "Traceback" not in err
    return lines[0]


@pytest.fixture(autouse=True)
def _grab(capsys):
    global _capsys
    _capsys = capsys


def test_a_real_process_exits_2_on_bad_input(tmp_path):
    out = lens_cli("capture", "no-such-model", "--out", tmp_path / "x")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "unknown model" in out.stderr


def test_bad_input_exits_2_with_one_line(tmp_path):
    assert "unknown model" in _bad("capture", "no-such-model", "--out", tmp_path / "x")
    assert "not found" in _bad("capture", "tiny-llama", "--corpus", tmp_path / "missing.txt", "--out", tmp_path / "x")
    (tmp_path / "empty.txt").write_text("")
    assert "empty" in _bad("capture", "tiny-llama", "--corpus", tmp_path / "empty.txt", "--out", tmp_path / "x")
    (tmp_path / "bin.txt").write_bytes(b"\x00\x01\x02\x03" * 100)
    assert "binary" in _bad("capture", "tiny-llama", "--corpus", tmp_path / "bin.txt", "--out", tmp_path / "x")
    assert "layer 7 does not exist" in _bad("capture", "tiny-llama", "--layers", "7", "--out", tmp_path / "x")
    assert "unknown site" in _bad("capture", "tiny-llama", "--sites", "resid_wat", "--out", tmp_path / "x")
    (tmp_path / "notmodel").mkdir()
    assert "not a model directory" in _bad("capture", str(tmp_path / "notmodel"), "--out", tmp_path / "x")
    assert "not an activation store" in _bad("store", "info", tmp_path / "notmodel")
    assert not (tmp_path / "x").exists()  # nothing was created by a refused run


def test_resume_on_a_store_of_another_model(tmp_path):
    ok = lens_cli("capture", "tiny-llama", "--corpus", "lee", "--max-tokens", "200", "--out", tmp_path / "s", "--quiet")
    assert ok.returncode == 0
    before = (tmp_path / "s" / "manifest.json").read_bytes()
    assert "other settings" in _bad("capture", "tiny-gpt2", "--corpus", "lee", "--max-tokens", "200",
                                    "--out", tmp_path / "s", "--resume")
    assert "other settings" in _bad("capture", "tiny-llama", "--corpus", "lee", "--max-tokens", "200",
                                    "--seq-len", "64", "--out", tmp_path / "s", "--resume")
    assert "already exists" in _bad("capture", "tiny-llama", "--corpus", "lee", "--max-tokens", "200",
                                    "--out", tmp_path / "s")
    assert (tmp_path / "s" / "manifest.json").read_bytes() == before


def test_app_store_device_is_checked_and_passed_on(monkeypatch):
    import torch

    from app.explorer.launch import command
    from app.explorer.state import parse_args

    cmd = command("r", "s", store_device="cuda:1")
    assert cmd[cmd.index("--store-device") + 1] == "cuda:1" and cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert parse_args(["--results", "r", "--store-device", "cuda:1"]).store_device == "cuda:1"
    monkeypatch.delenv("LENS_APP_STORE_DEVICE", raising=False)
    assert parse_args([]).store_device == "cpu"
    from app.commands.cli import main

    for device, says in [("gpu", "unknown device 'gpu'")] + ([] if torch.cuda.is_available() else
                                                            [("cuda", "'cuda' was requested")]):
        _capsys.readouterr()
        with pytest.raises(SystemExit) as stop:  # refused while the arguments are parsed: before any launch
            main(["app", "--store-device", device])
        err = _capsys.readouterr().err.strip().splitlines()
        assert stop.value.code == 2 and len(err) == 1 and "--store-device" in err[0] and says in err[0], err


def _websocket_status(port: int, host: str, origin: str | None = None) -> int:
    """The HTTP status of a WebSocket handshake on Streamlit's stream with this Host (101: accepted)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        lines = ["GET /_stcore/stream HTTP/1.1", f"Host: {host}", "Upgrade: websocket", "Connection: Upgrade",
                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
        if origin:
            lines.append(f"Origin: {origin}")
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return int(s.recv(1024).split(b" ", 2)[1])


def test_lens_app_stops_on_sigterm_even_with_its_output_gone(tmp_path):
    """SIGTERM to `lens app` stops it and its Streamlit server, also when whoever read their output is
    gone (a closed pipe: Streamlit's own handler then fails on its first print and never stops the server).
    While it runs, a WebSocket naming a foreign Host is refused (DNS rebinding)."""
    import signal
    import socket
    import time
    import urllib.request

    from app.explorer.launch import STOP_GRACE_S

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "app", "app", "--results", str(tmp_path), "--stores", str(tmp_path),
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1)
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, "lens app did not come up"
                time.sleep(0.3)
        # DNS rebinding: a WebSocket whose Host is a foreign name is refused (server.allowedHosts), ours is not
        assert _websocket_status(port, f"127.0.0.1:{port}") == 101
        assert _websocket_status(port, f"evil.example:{port}", origin="http://evil.example") == 403
        proc.stdout.close()  # the reader goes away
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=STOP_GRACE_S + 20)
        time.sleep(0.5)
        with pytest.raises(OSError):  # the server is gone with it
            urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# --help and argument errors: answered by a parser built from cheap modules, before torch is imported
CHEAP_ARGVS = [(["--help"], 0), (["study", "--help"], 0), (["capture", "--help"], 0), (["app", "--help"], 0),
               (["store", "merge", "--help"], 0), (["no-such-command"], 2), (["study", "no-such-study", "--out", "x"], 2),
               (["study", "all", "--out", "x", "--no-such-flag"], 2), (["study", "all"], 2),
               (["capture", "m", "--out", "x", "--model-dtype", "int8"], 2), (["app", "--port", "eighty"], 2)]
HEAVY = ("torch", "transformers")


@pytest.mark.parametrize("argv,code", CHEAP_ARGVS, ids=[" ".join(a) for a, _ in CHEAP_ARGVS])
def test_help_and_argument_errors_import_no_torch(argv, code):
    """What a user's shell runs (a process of its own, -X importtime listing every module it imports)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "app", *argv], capture_output=True, text=True,
                          env=env, timeout=120)
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    said = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == code, proc.stderr[-2000:]
    assert not {m for m in imported if m.split(".")[0] in HEAVY}, sorted(m for m in imported if m.split(".")[0] in HEAVY)
    assert "app.commands.cli" in imported  # (the probe sees the modules: the command line's own is among them)
    if code == 2:
        assert len(said) == 1 and said[0].startswith("lens: error:"), said
    else:
        assert said == [] and proc.stdout.startswith("usage: lens")


# the other cheap door: the explorer's data layer and every study's declaration it reads (no torch either)
EXPLORER_DOOR = ("import json, sys\n"
                 "import app.explorer.data\n"
                 "from studies.core.registry import STUDIES, declaration\n"
                 "[declaration(name) for name in STUDIES]\n"
                 "print(json.dumps(sorted(sys.modules)))\n")


def test_the_explorer_data_layer_and_the_declarations_import_no_torch():
    """The two doors (issue #41): everything else imports at module top; these stay cheap, which this and the
    --help test above hold (a process of its own, listing every module it ends up with)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", EXPLORER_DOOR], capture_output=True, text=True, env=env,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert {"app.explorer.data", "studies.core.registry"} <= imported
    assert sum(m.endswith(".declaration") for m in imported) >= 12  # every study's declaration was read
    assert not {m for m in imported if m.split(".")[0] in HEAVY}, sorted(m for m in imported if m.split(".")[0] in HEAVY)


def _each_parser(parser, name="lens"):
    import argparse

    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _each_parser(sub, f"{name} {sub_name}")


def test_help_shows_every_default():
    """Every option that has a default says it in --help: as '(default: X)', or in its own words."""
    import argparse

    from app.commands.cli import build_parser

    missing = []
    for name, parser in _each_parser(build_parser()):
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            default = action.default
            if (not action.option_strings or default is None or default is False or default == []
                    or default is argparse.SUPPRESS):
                continue
            if f"(default: {default})" not in text and "default" not in (action.help or "").lower():
                missing.append(f"{name} {action.option_strings[-1]} (default {default!r})")
    assert not missing, missing


def test_study_help_lists_every_study(monkeypatch):
    from app.commands.cli import build_parser
    from studies.core.registry import STUDIES

    monkeypatch.setenv("COLUMNS", "200")  # a terminal wide enough for one line per study (narrower ones wrap)

    study = dict(_each_parser(build_parser()))["lens study"]
    lines = study.format_help().split("studies:\n", 1)[1].splitlines()
    listed = {line.split()[0]: line.split(None, 1)[1] for line in lines if line.strip()}
    assert listed == {**{name: desc for name, (_, desc) in STUDIES.items()}, "all": listed.get("all")}
    assert "--only" in listed["all"]


def _as_seen(stream: str) -> list[str]:
    """The lines a terminal shows for ``stream``: carriage returns redraw, ESC[K erases to the end."""
    out = []
    for line in stream.replace("\r\n", "\n").split("\n"):
        out.append(line.replace("\x1b[K", "").split("\r")[-1])
    return [line for line in out if line.strip()]


def test_inspect_shows_a_progress_line_while_loading():
    """On a terminal (a real pseudo-terminal): 'loading MODEL: N s' counts up on stderr, then says how long it took;
    stdout is the description alone."""
    pty = pytest.importorskip("pty")
    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "app", "inspect", "tiny-gpt2"], stdout=subprocess.PIPE,
                            stderr=follower, env=env)
    os.close(follower)
    err = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        err += chunk
    os.close(leader)
    out = proc.stdout.read().decode()
    assert proc.wait(timeout=300) == 0
    err = err.decode()
    assert "\rloading tiny-gpt2: 0 s" in err, err
    seen = _as_seen(err)
    assert len(seen) == 1 and seen[0].startswith("loaded tiny-gpt2 in ") and seen[0].endswith(" s"), seen
    assert "loading" not in out and "gpt2" in out.lower()


def test_a_refused_load_leaves_the_error_as_the_one_line(monkeypatch):
    """The progress line is wiped before the error, which stays the one line the terminal shows."""
    import io

    from app.commands.cli import main

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert main(["inspect", "no-such-model"]) == 2
    assert term.getvalue().startswith("\rloading no-such-model: 0 s")
    seen = _as_seen(term.getvalue())
    assert len(seen) == 1 and seen[0].startswith("lens: error: unknown model"), seen
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal: nothing but the error
    assert main(["inspect", "no-such-model"]) == 2
    assert sys.stderr.getvalue().startswith("lens: error: unknown model")


def test_study_all_ends_with_the_line_that_opens_the_explorer(tmp_path):
    import shlex

    from app.commands.cli import build_parser, main
    from app.commands.study import _app_line
    from studies.reporting.results import find_results

    out = tmp_path / "my results"
    _capsys.readouterr()
    assert main(["study", "all", "--model", "tiny-llama", "--max-tokens", "300", "--only", "linearity",
                 "--out", str(out), "--quiet"]) == 0
    last = _capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("explore: lens app ")
    args = build_parser().parse_args(shlex.split(last.split(": ", 1)[1])[1:])  # what a shell passes to lens
    (rec,) = find_results(args.results)
    assert rec.study == "linearity"
    assert (Path(rec.config["store"]).resolve() / "manifest.json").is_file()
    assert Path(rec.config["store"]).resolve().is_relative_to(Path(args.stores).resolve())
    # --store elsewhere: the explorer's stores folder is the one that holds it
    assert _app_line("r", "stores/smol") == "lens app --results r --stores stores"
