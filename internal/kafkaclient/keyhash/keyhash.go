// Package keyhash is Kafka's key partitioner (murmur2, as the Java client
// and librdkafka's murmur2_random place a non-empty key), with no
// dependency: the Kafka client wrapper and the consumer-state store (which
// the wrapper imports) both find a user's partition with it.
package keyhash

// Partition is the partition the murmur2 partitioner puts a non-empty key
// in among partitions (0 when partitions <= 0).
func Partition(key string, partitions int) int32 {
	if partitions <= 0 {
		return 0
	}
	return int32((uint32(Murmur2([]byte(key))) & 0x7fffffff) % uint32(partitions))
}

// Murmur2 is Kafka's Utils.murmur2.
func Murmur2(data []byte) int32 {
	const (
		seed = uint32(0x9747b28c)
		m    = uint32(0x5bd1e995)
		r    = 24
	)
	n := len(data)
	h := seed ^ uint32(n)
	for i := 0; i+4 <= n; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := n &^ 3
	switch n % 4 {
	case 3:
		h ^= uint32(data[tail+2]) << 16
		fallthrough
	case 2:
		h ^= uint32(data[tail+1]) << 8
		fallthrough
	case 1:
		h ^= uint32(data[tail])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}
