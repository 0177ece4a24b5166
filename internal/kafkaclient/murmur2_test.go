package kafkaclient

// murmur2 is Kafka's Java Utils.murmur2 (keyHash, which KeyPartition
// uses), as the Java client's default partitioner applies it: partition =
// (murmur2(key) & 0x7fffffff) % partitions. The tests compare librdkafka's
// murmur2_random placement against it.
var murmur2 = keyHash

func javaPartition(key string, partitions int) int32 {
	return int32((uint32(murmur2([]byte(key))) & 0x7fffffff) % uint32(partitions))
}
