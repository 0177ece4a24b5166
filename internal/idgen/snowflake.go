package idgen

import (
	"fmt"
	"strconv"
	"sync/atomic"
	"time"
)

// Layout of an ID, high to low: 1 unused sign bit, 41 bits of milliseconds
// since the epoch, 10 node bits (5 datacenter + 5 worker, or a 10-bit worker
// when the datacenter is 0), 12 bits of sequence.
const (
	sequenceBits = 12
	nodeBits     = 10
	timeBits     = 41

	nodeShift = sequenceBits
	timeShift = sequenceBits + nodeBits

	maxSequence   = 1<<sequenceBits - 1
	maxMillis     = 1<<timeBits - 1
	maxWorker10   = 1<<nodeBits - 1
	maxHalfNode   = 1<<(nodeBits/2) - 1 // 31: datacenter, and worker in 5+5 mode
	halfNodeShift = nodeBits / 2
)

// Clock-rollback tiers.
const (
	// A rollback up to reuseRollback keeps issuing IDs at the last
	// timestamp while its sequence lasts: NTP slews of a few milliseconds
	// must not stall the hot path.
	reuseRollback = 5 * time.Millisecond
	// A rollback up to waitRollback is waited out; beyond it Next fails with
	// ErrClockBackwards rather than block callers.
	waitRollback = time.Second
)

// SnowflakeConfig configures a Generator.
type SnowflakeConfig struct {
	// Epoch is the zero of the 41-bit millisecond field; it must not be in
	// the future. All generators of one ID space must share it.
	Epoch time.Time
	// DatacenterID 0 selects the 10-bit worker layout (WorkerID 0..1023);
	// 1..31 selects the 5+5 layout (WorkerID 0..31).
	DatacenterID int
	// WorkerID must be unique among live generators of the same datacenter;
	// an Allocator hands them out.
	WorkerID int
}

// Generator issues Snowflake IDs. It is safe for concurrent use and takes no
// lock: the last timestamp and sequence live in one atomic word updated by
// compare-and-swap.
type Generator struct {
	// state is lastMillis<<sequenceBits | sequence. One word so that a
	// timestamp and its sequence always change together.
	state   atomic.Uint64
	node    int64 // node bits, already shifted into place
	epochMs int64 // epoch in Unix milliseconds
	layout  Layout
	clock   Clock
	fast    unixNanoClock // clock's fast path, if it has one
	m       *metrics
}

// New returns a Generator for cfg. Options: WithClock, WithRegisterer.
func New(cfg SnowflakeConfig, opts ...Option) (*Generator, error) {
	o := buildOptions(opts)
	m, err := newMetrics(o.reg)
	if err != nil {
		return nil, err
	}
	g := &Generator{
		epochMs: cfg.Epoch.UnixMilli(),
		layout:  Layout{Epoch: time.UnixMilli(cfg.Epoch.UnixMilli()), SplitNode: cfg.DatacenterID > 0},
		clock:   o.clock,
		m:       m,
	}
	g.fast, _ = o.clock.(unixNanoClock)
	g.node, err = g.layout.nodeBits(cfg.DatacenterID, cfg.WorkerID)
	if err != nil {
		return nil, err
	}
	now := g.nowMs()
	if now < 0 || now > maxMillis {
		return nil, fmt.Errorf("%w: idgen.epoch %s is %s from now, allowed [0, %s]", ErrClockOutOfRange,
			cfg.Epoch.Format(time.RFC3339), time.Duration(now)*time.Millisecond, time.Duration(maxMillis)*time.Millisecond)
	}
	return g, nil
}

func (g *Generator) unixNano() int64 {
	if g.fast != nil {
		return g.fast.UnixNano()
	}
	return g.clock.Now().UnixNano()
}

// nowMs is milliseconds since the epoch, floored.
func (g *Generator) nowMs() int64 { return floorDiv(g.unixNano(), int64(time.Millisecond)) - g.epochMs }

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// Next returns a new ID. It waits (at most about a second) when the
// millisecond's 4,096 sequence numbers are used up or the clock stepped back
// by 5 ms to 1 s, and fails with ErrClockBackwards beyond that.
func (g *Generator) Next() (int64, error) {
	for {
		// Load the state before reading the clock: then a clock reading
		// behind the stored time means the clock really went back, not that
		// another goroutine read a later clock in between.
		old := g.state.Load()
		last := int64(old >> sequenceBits)
		seq := old & maxSequence
		now := g.nowMs()

		var ms int64
		switch back := last - now; {
		case back < 0:
			if now > maxMillis {
				g.m.errors.WithLabelValues(reasonClockOutOfRange).Inc()
				return 0, fmt.Errorf("%w: %d ms since the epoch", ErrClockOutOfRange, now)
			}
			ms, seq = now, 0
		case back <= reuseRollback.Milliseconds():
			// Same millisecond, or a small rollback: keep the last timestamp.
			if seq == maxSequence {
				g.m.waits.WithLabelValues(reasonSequenceExhausted).Inc()
				g.waitUntil(last + 1)
				continue
			}
			ms, seq = last, seq+1
		case back <= waitRollback.Milliseconds():
			g.m.waits.WithLabelValues(reasonClockBackwards).Inc()
			g.waitUntil(last)
			continue
		default:
			g.m.errors.WithLabelValues(reasonClockBackwards).Inc()
			return 0, fmt.Errorf("%w by %s (more than %s)", ErrClockBackwards, time.Duration(back)*time.Millisecond, waitRollback)
		}
		if g.state.CompareAndSwap(old, uint64(ms)<<sequenceBits|seq) {
			return ms<<timeShift | g.node | int64(seq), nil
		}
	}
}

// NextString returns Next formatted in decimal.
func (g *Generator) NextString() (string, error) {
	id, err := g.Next()
	if err != nil {
		return "", err
	}
	return strconv.FormatInt(id, 10), nil
}

// waitUntil returns once the clock reads at least targetMs since the epoch.
func (g *Generator) waitUntil(targetMs int64) {
	target := (g.epochMs + targetMs) * int64(time.Millisecond)
	for {
		d := time.Duration(target - g.unixNano())
		if d <= 0 {
			return
		}
		g.clock.Sleep(d)
	}
}

// Layout returns how this generator's IDs are laid out.
func (g *Generator) Layout() Layout { return g.layout }

// Decompose splits an ID of this generator's layout into its fields.
func (g *Generator) Decompose(id int64) Parts { return g.layout.Decompose(id) }

// Parts are the fields of an ID.
type Parts struct {
	Time         time.Time // millisecond precision
	DatacenterID int       // always 0 in the 10-bit worker layout
	WorkerID     int
	Sequence     int
}

// Layout says how to read the node bits and where time starts; IDs from
// generators with different layouts cannot be told apart by their bits.
type Layout struct {
	Epoch time.Time
	// SplitNode is the 5-bit datacenter + 5-bit worker layout; otherwise the
	// node bits are one 10-bit worker ID.
	SplitNode bool
}

// Decompose splits id into its fields. The sign bit is ignored.
func (l Layout) Decompose(id int64) Parts {
	u := uint64(id)
	ms := int64(u>>timeShift) & maxMillis
	node := int(u>>nodeShift) & maxWorker10
	p := Parts{
		Time:     time.UnixMilli(l.Epoch.UnixMilli() + ms),
		WorkerID: node,
		Sequence: int(u & maxSequence),
	}
	if l.SplitNode {
		p.DatacenterID = node >> halfNodeShift
		p.WorkerID = node & maxHalfNode
	}
	return p
}

// Compose builds the ID with fields p; Time is truncated to the millisecond.
func (l Layout) Compose(p Parts) (int64, error) {
	ms := p.Time.UnixMilli() - l.Epoch.UnixMilli()
	if ms < 0 || ms > maxMillis {
		return 0, fmt.Errorf("%w: %s is %d ms from the epoch", ErrClockOutOfRange, p.Time.Format(time.RFC3339Nano), ms)
	}
	if p.Sequence < 0 || p.Sequence > maxSequence {
		return 0, fmt.Errorf("idgen: sequence must be in [0, %d], got %d", maxSequence, p.Sequence)
	}
	node, err := l.nodeBits(p.DatacenterID, p.WorkerID)
	if err != nil {
		return 0, err
	}
	return ms<<timeShift | node | int64(p.Sequence), nil
}

func (l Layout) nodeBits(datacenter, worker int) (int64, error) {
	if !l.SplitNode {
		if datacenter != 0 || worker < 0 || worker > maxWorker10 {
			return 0, fmt.Errorf("idgen: 10-bit worker layout needs datacenter 0 and worker in [0, %d], got %d/%d",
				maxWorker10, datacenter, worker)
		}
		return int64(worker) << nodeShift, nil
	}
	if datacenter < 0 || datacenter > maxHalfNode || worker < 0 || worker > maxHalfNode {
		return 0, fmt.Errorf("idgen: 5+5 layout needs datacenter and worker in [0, %d], got %d/%d",
			maxHalfNode, datacenter, worker)
	}
	return int64(datacenter<<halfNodeShift|worker) << nodeShift, nil
}
