"""``lens app``: the Streamlit explorer on results and stores folders."""

from __future__ import annotations

from app.commands.flags import device_arg


def add_parsers(sub) -> None:
    app = sub.add_parser("app", help="start the Streamlit explorer",
                         epilog="after `lens study all --out results`: lens app --results results --stores results")
    app.add_argument("--results", default="results",
                     help="folder searched (all the way down) for results folders written by `lens study ... --out`; "
                          "the Overview, study pages and Token view show them")
    app.add_argument("--stores", default="stores",
                     help="folder searched for stores written by `lens capture --out` (stores under --results are "
                          "found too): the Nearest tokens page reads their states, the Token view their words")
    app.add_argument("--port", type=int, default=8501, help="port of the page (http://HOST:PORT)")
    app.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0: every interface, and anyone who reaches it reads the results)")
    app.add_argument("--store-device", default="cpu", type=device_arg,
                     help="where the Nearest tokens page holds store layers: cpu, cuda or cuda:N")
    app.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                     help="another host name browsers reach the explorer by (a reverse proxy's; repeatable; '*' "
                          "accepts any). WebSockets naming any other host are refused (DNS rebinding)")


def _cmd_app(args):
    from app.explorer.launch import launch

    return launch(results=args.results, stores=args.stores, port=args.port, host=args.host,
                  store_device=args.store_device, allow_hosts=args.allow_host)


COMMANDS = {"app": _cmd_app}
