from dsaops.cli import main

raise SystemExit(main())
