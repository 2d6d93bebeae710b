import sys

from .apply import main

sys.exit(main())
