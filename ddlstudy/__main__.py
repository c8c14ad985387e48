from ddlstudy.cli import main

raise SystemExit(main())
