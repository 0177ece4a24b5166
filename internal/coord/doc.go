// Package coord is kfpipe's etcd coordination provider (seed 002): one
// Provider, built by New, owns one etcd client and gives
//
//   - a service Registry: Register on a lease kept alive in the background
//     (re-registered when the lease is lost), Unregister, Discover, and a
//     Watch of add/update/remove events;
//   - a ConfigCenter with typed (JSON) values through the generic functions
//     Get, GetWithVersion, List, Set, CompareAndSet, Watch and WatchPrefix;
//   - Locks (go.etcd.io/etcd/client/v3/concurrency mutexes) with a fencing
//     token and GuardedPut, a write that etcd rejects once the lock is lost;
//   - InstanceIDAllocators handing out IDs in [1, maxID] on lease-bound
//     keys (seed 000).
//
// Every key lives under Config.Namespace (default "/kfpipe/"), in a
// directory per capability: services/<name>/<id>, config/<key>,
// locks/<key>/, instance_ids/<service>/<id>. Keys passed to this package are
// relative to those directories.
//
// Watches (of the registry and of the config center) survive broken
// connections and leader changes: they resume from the revision after the
// last one they delivered, so no event is missed or repeated. When that
// revision has been compacted away they reload the current state and report
// it (a Resync event for config, the difference as add/update/remove events
// for the registry) instead of going silent. Each watch starts with the
// current state, so a caller needs no separate read and has no gap between
// reading and watching.
//
// Unlike the seed there is no GetConnection: kfpipe has no gRPC services, so
// the registry only stores and reports addresses. Also unlike the seed, the
// instance-ID allocator claims an ID with one create-if-absent transaction
// instead of a global lock plus a scan (the transaction is already atomic),
// and its lease is its own, not the registration's, so a registration that
// re-registers after a lost lease does not pretend to still hold an ID that
// another instance may have taken meanwhile.
//
// Provider.Close releases everything the Provider holds (instance IDs,
// locks, registrations), ends every watch and goroutine it started, and
// closes the client.
package coord
