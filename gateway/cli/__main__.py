import sys

from pluto.gateway.cli import main

sys.exit(main())
