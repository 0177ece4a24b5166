package kafkaclient

import "github.com/kfpipe/kfpipe/internal/kafkaclient/keyhash"

// KeyPartition is the partition the configured producer (partitioner
// murmur2_random, as the Java client) puts a non-empty key in: readers use
// it to find one user's records without scanning every partition.
func KeyPartition(key string, partitions int) int32 { return keyhash.Partition(key, partitions) }

// keyHash is Kafka's Utils.murmur2.
func keyHash(data []byte) int32 { return keyhash.Murmur2(data) }
