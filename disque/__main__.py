from disque.server import main

raise SystemExit(main())
