from peakmem.cli import main

raise SystemExit(main())
