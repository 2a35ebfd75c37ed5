"""``lens app``: start the Streamlit explorer on the given roots (localhost unless told otherwise)."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
from pathlib import Path
import socket

from lens.errors import LensInputError
from lens.runtime.devices import parse_device

log = logging.getLogger(__name__)
MAIN = Path(__file__).resolve().parent / "main.py"
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
STOP_GRACE_S = 10  # after SIGTERM, how long Streamlit may take to stop before it is killed


ANY_ADDRESS = {"0.0.0.0", "::"}


def allowed_hosts(host: str, extra=()) -> list[str]:
    """The names a browser may reach the explorer by when it binds ``host``: Streamlit refuses a
    WebSocket whose ``Host`` header is any other (``server.allowedHosts``). Left empty, Streamlit
    accepts every Host, and a page on evil.example whose name is rebound to 127.0.0.1 (DNS rebinding)
    could read the results. Localhost: its names; every interface: this machine's names too; any other
    address: that address. ``extra`` adds names (a reverse proxy's; ``*`` accepts any)."""
    names = ["localhost", "127.0.0.1", "::1"] if host in LOCAL_HOSTS | ANY_ADDRESS else []
    if host in ANY_ADDRESS:
        try:
            names += [socket.gethostname(), socket.getfqdn()]
            names += [a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None)]
        except OSError:  # no name service: the local names and --allow-host
            pass
    elif host not in LOCAL_HOSTS:
        names.append(host.strip("[]"))
    for item in extra or ():
        names += [n.strip() for n in str(item).split(",") if n.strip()]
    bad = [n for n in names if any(c.isspace() or c in "/@?#" for c in n)]
    if bad:
        raise LensInputError(f"--allow-host: expected host names such as app.example.com, got {bad[0]!r}")
    return list(dict.fromkeys(n.lower().rstrip(".") for n in names if n))


def command(results, stores, port: int = 8501, host: str = "127.0.0.1", store_device: str = "cpu",
            allow_hosts=()) -> list[str]:
    """The ``streamlit run`` command line (no shell: every value is one argument)."""
    if not 0 < int(port) < 65536:
        raise LensInputError(f"--port: expected 1..65535, got {port}")
    if not host or any(c.isspace() for c in host):
        raise LensInputError(f"--host: expected an address, got {host!r}")
    hosts = [arg for name in allowed_hosts(host, allow_hosts) for arg in ("--server.allowedHosts", name)]
    return [sys.executable, "-m", "streamlit", "run", str(MAIN), "--server.address", host,
            "--server.port", str(int(port)), "--server.headless", "true", *hosts,
            "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal",
            # no reload on a source change: the watcher polls every module of the app (CPU the browser needs)
            "--server.fileWatcherType", "none", "--",
            "--results", str(Path(results).resolve()), "--stores", str(Path(stores).resolve()),
            "--store-device", str(store_device)]


def launch(results="results", stores="stores", port: int = 8501, host: str = "127.0.0.1",
           store_device: str = "cpu", allow_hosts=()) -> int:
    """Run the explorer until interrupted; returns Streamlit's exit code. ``store_device`` (checked
    here, so a missing GPU is one line and exit 2, not an error on a page) is where the Nearest tokens
    page holds store layers."""
    store_device = parse_device(store_device)
    if host not in LOCAL_HOSTS:
        log.warning("binding the explorer to %s: anyone who can reach this address can read the results", host)
    if not Path(results).is_dir():
        log.warning("results folder %s does not exist yet; the explorer will show how to make it", results)
    proc = subprocess.Popen(command(results, stores, port, host, store_device, allow_hosts))

    def stop(signum, frame):
        """Pass SIGTERM on to Streamlit, so stopping `lens app` never leaves an orphaned server behind;
        kill it if it has not stopped in STOP_GRACE_S (Streamlit's own handler prints first, and with its
        output gone — a closed pipe — it never gets to stop the server)."""
        proc.send_signal(signum)
        timer = threading.Timer(STOP_GRACE_S, lambda: proc.poll() is None and proc.kill())
        timer.daemon = True
        timer.start()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            return proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
