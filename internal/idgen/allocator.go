package idgen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"os"
	"time"
)

// Allocator hands this process a worker ID that no other live holder has,
// and keeps it reserved while the process lives.
//
// Allocate claims an ID. KeepAlive renews the claim in the background and
// reports on the returned channel; an ErrKeyStolen or ErrLeaseExpired there
// means the ID may now be used elsewhere and the process must stop issuing
// IDs with it. The channel is closed after such an error, when ctx is done,
// or by Stop. Stop ends the renewal, waits for it, and frees the ID if it is
// still ours; the Allocator cannot be used after Stop.
type Allocator interface {
	Allocate(ctx context.Context) (int, error)
	KeepAlive(ctx context.Context) <-chan error
	Stop(ctx context.Context) error
}

// AllocatorConfig configures both allocator backends: idgen.allocator
// (AllocatorFromConfig), which internal/config checked when it loaded.
type AllocatorConfig struct {
	// Prefix starts every key: Redis keys are Prefix+"idgen:worker:{id}",
	// etcd keys Prefix+"idgen/worker/{id}".
	Prefix string
	// MaxID is the pool size: IDs are taken from [0, MaxID). At most 1024
	// (the 10-bit worker layout), 32 when a datacenter ID is used.
	MaxID int
	// TTL is how long a claim outlives its holder's last renewal. KeepAlive
	// renews every TTL/3.
	TTL time.Duration
	// Owner is stored as the key's value so a holder can tell its claim from
	// someone else's; it must be unique per allocator. Empty means
	// hostname/pid/random.
	Owner string
}

func (c *AllocatorConfig) setDefaults() {
	if c.Owner == "" {
		c.Owner = defaultOwner()
	}
}

func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
}

// randomOffset spreads concurrent starters over the pool so they rarely
// race for the same key.
func randomOffset(n int) int {
	v, err := rand.Int(rand.Reader, big.NewInt(int64(n)))
	if err != nil {
		return 0
	}
	return int(v.Int64())
}

func noFreeID(maxID int, prefix string) error {
	return fmt.Errorf("%w: all %d worker ids (pool size idgen.allocator.max_id=%d) under %q are taken",
		ErrNoFreeID, maxID, maxID, prefix)
}

// sendFatal delivers an error that ends the keepalive: it blocks (the
// receiver must learn the ID is lost) unless the caller gave up on ctx.
func sendFatal(ctx context.Context, errc chan<- error, err error) {
	select {
	case errc <- err:
	case <-ctx.Done():
	}
}

// sendTransient reports a renewal failure that may still heal. It never
// blocks: blocking would delay the next renewal. If the previous report is
// still unread it is dropped; the channel's single slot is enough to tell
// the receiver that renewals are failing.
func sendTransient(errc chan<- error, err error) {
	select {
	case errc <- err:
	default:
	}
}

// closedErr returns a closed channel carrying err, for KeepAlive calls that
// cannot start.
func closedErr(err error) <-chan error {
	c := make(chan error, 1)
	c <- err
	close(c)
	return c
}
