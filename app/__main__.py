import sys

from app.commands.cli import main

sys.exit(main())
