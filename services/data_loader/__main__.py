from services.data_loader.main import main

raise SystemExit(main())
