import sys

from engram_ledger.services.cli.main import main

sys.exit(main())
