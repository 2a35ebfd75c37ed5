"""The commands of ``lens``, one module per command group: ``models`` (models, corpora, inspect), ``capture``
(capture, stats), ``store`` (store info / verify / merge), ``study`` (study, report), ``explorer`` (app).

Each adds its own subcommands to the parser (``add_parsers``) and names the function that runs each
(``COMMANDS``); ``parser`` puts them together, ``flags`` holds what several share. The entry point and the error
boundary are app/commands/cli.py. Every module here is cheap to import: a command imports torch and ``lens`` when it runs.
"""
