import sys

from lakehouse.rehearsal.scenario import main

sys.exit(main())
