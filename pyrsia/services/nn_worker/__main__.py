from pyrsia.services.nn_worker.launch import main

raise SystemExit(main())
