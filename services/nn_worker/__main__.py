from services.nn_worker.main import main

raise SystemExit(main())
