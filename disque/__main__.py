from disque.process import main

raise SystemExit(main())
