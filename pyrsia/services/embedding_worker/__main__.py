from pyrsia.services.embedding_worker.main import main

raise SystemExit(main())
