"""One frozen dataclass per route body, validated once on arrival (PROTOCOL.md).

Every handler turns its msgpack body into one of these with ``from_wire(body)``, which
checks each field and raises ``InvalidInputError`` naming the offending one (a 400);
every client builds its body with ``to_wire()``. Answers go the other way: the server
writes ``to_wire()``, the client checks ``from_wire(answer)`` once (a bad answer is a
``ProtocolError``). Nothing downstream checks the same fields again. Arrays stay the
read-only views the codec decoded (no copy).

=====================  ==============================  ===============================
route                  request body -> answer          module
=====================  ==============================  ===============================
PS /lookup             PSLookup -> PSLookupAnswer      pyrsia.shared.wire.ps
PS /update             PSUpdate -> UpdateTotals        pyrsia.shared.wire.ps
PS /stats              Empty -> PSStats                pyrsia.shared.wire.ps
worker /batch          PutBatch (IDPart)               pyrsia.shared.wire.worker
worker /lookup         Lookup -> Embeddings            pyrsia.shared.wire.worker
worker /lookup_direct  LookupDirect -> Embeddings      pyrsia.shared.wire.worker
worker /gradients      Gradients -> GradientsApplied   pyrsia.shared.wire.worker
worker /schema         Empty -> WorkerSchema           pyrsia.shared.wire.worker
worker /stats          Empty -> WorkerStats            pyrsia.shared.wire.worker
/configure             Configure                       pyrsia.shared.wire.admin
/register_optimizer    RegisterOptimizer               pyrsia.shared.wire.admin
/dump, /load           Directory                       pyrsia.shared.wire.admin
/clear, /stats         Empty                           pyrsia.shared.wire.admin
NN ingress /ingress    IngressBatch (DensePart)        pyrsia.shared.wire.ingress
NN ingress /done       LoaderDone                      pyrsia.shared.wire.ingress
serve /predict         PredictRequest -> PredictAnswer pyrsia.shared.wire.serve
=====================  ==============================  ===============================
"""
