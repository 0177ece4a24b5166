// Package ratelimit protects the consumer from flooding users (invariants
// I5 and I6): a per-user sliding-window limiter with a penalty
// block, user groups (normal, seed, vip, suspicious, whitelist), an optional
// progressive penalty, admin operations over Redis, and a per-user circuit
// breaker.
//
// The hot window (timestamps and violation count) lives only in process
// memory; everything an operator must see or change from any node — blocks,
// groups, block history and the rules — lives in Redis and is cached per
// user, refreshed by pub/sub events, so a change reaches every node within a
// second without a Redis read per message. Redis
// keys, under the configured prefix:
//
//	rl:block:{user}    block end as unix ms, PX = remaining block; "permanent" without TTL
//	rl:group:{user}    the user's group; absent = the default group
//	rl:history:{user}  zset of automatic block times (progressive penalty)
//	rl:blocked         zset user → block end ms (+inf = permanent), for listing
//	rl:rules           JSON map group → rule, overriding the configured groups
//	rl:events          pub/sub channel announcing every change above
package ratelimit
