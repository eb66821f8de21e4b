from dsv41c.cli import main

raise SystemExit(main())
