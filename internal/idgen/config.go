package idgen

import "github.com/kfpipe/kfpipe/internal/config"

// SnowflakeFromConfig maps the validated idgen section and an allocated
// worker ID to a SnowflakeConfig.
func SnowflakeFromConfig(c config.IDGen, workerID int) SnowflakeConfig {
	return SnowflakeConfig{Epoch: c.EpochTime(), DatacenterID: c.DatacenterID, WorkerID: workerID}
}

// AllocatorFromConfig maps idgen.allocator to an AllocatorConfig. prefix is
// the Redis key prefix (redis.key_prefix) or an etcd directory such as
// "/kfpipe/"; owner may be empty (hostname/pid/random).
func AllocatorFromConfig(c config.IDGen, prefix, owner string) AllocatorConfig {
	return AllocatorConfig{Prefix: prefix, MaxID: c.Allocator.MaxID, TTL: c.Allocator.TTL, Owner: owner}
}

// SequencerFromConfig maps idgen.sequencer to a SequencerConfig; prefix is
// redis.key_prefix.
func SequencerFromConfig(c config.IDGen, prefix string) SequencerConfig {
	q := c.Sequencer
	return SequencerConfig{Driver: q.Driver, Prefix: prefix, Step: q.Step, MaxValue: q.MaxValue, TTL: q.TTL}
}
