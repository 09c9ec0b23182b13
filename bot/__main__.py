import sys

from bot.app.cli import main

sys.exit(main())
