from services.embedding_worker.main import main

raise SystemExit(main())
