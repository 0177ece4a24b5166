// Package producer is the core of kf-producer: the per-open_kfid sync loop
// (lock → sync_msg pages → produce → wait for delivery reports → fenced
// cursor write) and the asynchronous Kafka producer it uses.
//
// The loop's only promise to WeChat is I1: a cursor moves past a message
// only after Kafka acknowledged it with acks=all. When Kafka is down the
// cursor stays and WeChat keeps the messages (3 days); when it is back the
// page is produced again, so duplicates are possible and the consumer drops
// them by upstream msgid (I3).
//
// Collaborators owned by other packages (the sync_msg client, the lock, the
// Snowflake generator) are consumed through the small interfaces in
// sync.go; the daemon adapts them.
package producer
