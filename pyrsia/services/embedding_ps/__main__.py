from pyrsia.services.embedding_ps.main import main

raise SystemExit(main())
