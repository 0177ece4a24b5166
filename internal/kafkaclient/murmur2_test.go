package kafkaclient

// murmur2 is Kafka's Java Utils.murmur2, used by the Java client's default
// partitioner: partition = (murmur2(key) & 0x7fffffff) % partitions. The
// tests compare librdkafka's murmur2_random placement against it.
func murmur2(data []byte) int32 {
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

func javaPartition(key string, partitions int) int32 {
	return int32((uint32(murmur2([]byte(key))) & 0x7fffffff) % uint32(partitions))
}
