from pyrsia.services.data_loader.launch import main

raise SystemExit(main())
