// Package idgen generates identifiers: Snowflake int64 IDs (lock-free, with
// clock-rollback tiers), worker-ID allocation so that no two live generators
// share a worker ID (Redis and etcd backends), per-key Redis sequences, and
// UUIDv7 strings.
//
// Typical start-up: Allocate a worker ID, run KeepAlive and treat any error
// on its channel as "stop issuing IDs", build a Generator with that worker
// ID, and call Stop on shutdown.
package idgen
