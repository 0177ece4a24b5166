package wecom

// Message origins in sync_msg items (WeChat's origin). The items
// themselves are read by chatmsg.ParseItem: SyncMsg returns them as the
// records the producer sends to Kafka.
const (
	OriginCustomer = 3 // sent by the WeChat user
	OriginEvent    = 4 // system event
	OriginServicer = 5 // sent by a servicer from the WeCom client
)
