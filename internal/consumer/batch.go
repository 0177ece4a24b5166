package consumer

import "time"

// Batch mode (WithBatch): a user's actor hands the handler the user's
// consecutive queued messages together instead of one by one. A batch
// takes the one processing path (processBatch, process.go), of which a
// single message is the batch of one.
//
//   - A batch is the messages already in the user's mailbox when the actor
//     takes the next one, plus those arriving within the wait, at most max,
//     in partition order, all of one partition.
//   - Dedup is per message: the messages the state store holds as done are
//     left out (finished as duplicates); the handler gets the others. With
//     none left it is not called.
//   - The handler is called once per batch: Handle with the batch's first
//     message, and handler.BatchFrom(ctx) returning the whole batch.
//     Retries, the attempt timeout, the outage gate, the fencing token and
//     the lease's hold on the work are those of one message.
//   - Success: each message gets its own done mark, queued from the last
//     message to the first, so the first is marked last: until it is done,
//     a re-run batch begins with the same first message (the exactly-once
//     replies are keyed by it: docs/handlers.md).
//   - Failure after the attempts, or Permanent: each message of the batch
//     becomes its own dead letter, in order, with the batch's reason and
//     attempts. A message that cannot be decoded is dead-lettered alone and
//     left out of the batch.

// WithBatch makes the consumer hand each user's consecutive queued
// messages to the handler together: up to size messages, waiting up to wait
// for more when fewer are queued (0: only those already queued). The
// handler is called with the batch's first message and
// handler.BatchFrom(ctx) returns the batch. size 1 or less leaves
// batching off (the default).
func WithBatch(size int, wait time.Duration) Option {
	return func(o *options) { o.batch = batchMode{max: size, wait: max(wait, 0)} }
}
