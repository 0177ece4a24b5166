package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kfpipe/kfpipe/internal/coord"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestChaosEtcdLeaderLoss: the coord provider on a private three-member
// etcd cluster whose leader is killed with SIGKILL and resumed later, while
//
//   - three service instances are registered (one of them registered again
//     with new metadata every half second);
//   - a writer Sets a new key under a prefix 20 times a second;
//   - two Providers each follow the service with a Registry Watch and the
//     prefix with a WatchPrefix: one knows every member, the other only the
//     member that will be killed, so at least one watch loses its member
//     mid-stream;
//   - two contenders, each on its own Provider, take turns holding one
//     Lock and write through GuardedPut with their fencing token, and after
//     each hold try one more GuardedPut with the old token.
//
// The judge reads etcd's own history of the namespace afterwards (the
// cluster never compacts): each watch must have delivered every change of
// its keys once, in revision order (a resync after a compaction is counted
// as such, not as silence); every acknowledged Set must be in the history;
// no guarded write may have been made while its token was not the lock's
// holder, no two holds may overlap in time, and every write with a token
// whose hold had ended must have been rejected; and Discover must list
// every registration again once the cluster is whole.
func TestChaosEtcdLeaderLoss(t *testing.T) {
	// make chaos only: make test keeps to the scenarios of the pipeline's
	// invariants under crashes and outages (scripts/test.sh).
	SkipUnlessFull(t)
	began := time.Now()
	warm, down, after := Size(3*time.Second, 8*time.Second), Size(5*time.Second, 10*time.Second), Size(4*time.Second, 8*time.Second)
	ctx := t.Context()

	cl := PrivateEtcdCluster(t)
	raw := cl.Client()
	first := cl.Leader(ctx, time.Second)
	if first == 0 {
		t.Fatal("the etcd cluster has no leader")
	}
	ns := "/chaos-" + testenv.Short() + "/"
	reg := prometheus.NewRegistry()
	newProvider := func(endpoints ...string) *coord.Provider {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		p, err := coord.New(cctx, coord.Config{Endpoints: endpoints, DialTimeout: time.Second,
			KeepAlive: 3 * time.Second, Namespace: ns}, coord.WithRegisterer(reg))
		if err != nil {
			t.Fatalf("coord.New: %v", err)
		}
		t.Cleanup(func() { _ = p.Close() })
		return p
	}
	// One Provider per role, as if each were its own process.
	all := cl.Endpoints
	pWatch, pPinned := newProvider(all...), newProvider(cl.Endpoints[first-1])
	pReg, pWrite, pA, pB := newProvider(all...), newProvider(all...), newProvider(all...), newProvider(all...)

	start, err := raw.Get(ctx, ns+"end")
	if err != nil {
		t.Fatalf("read start revision: %v", err)
	}
	startRev := start.Header.Revision
	// The watches start before anything is written under their keys, so
	// every change in etcd's history after startRev is one they must report.
	watchCtx, endWatches := context.WithCancel(ctx)
	defer endWatches()
	watchers := []*watcher{
		startWatcher(t, watchCtx, "all-members", pWatch),
		startWatcher(t, watchCtx, fmt.Sprintf("member%d-only", first), pPinned),
	}

	regs := &registrar{p: pReg}
	for _, id := range []string{"i1", "i2", "i3"} {
		if err := pReg.Registry().Register(ctx, instance(id, 0), regTTL); err != nil {
			t.Fatalf("register %s: %v", id, err)
		}
	}
	lockA, err := pA.NewLock(lockKey, lockTTL)
	if err != nil {
		t.Fatal(err)
	}
	lockB, err := pB.NewLock(lockKey, lockTTL)
	if err != nil {
		t.Fatal(err)
	}

	actx, stopActors := context.WithCancel(ctx)
	defer stopActors()
	var actors sync.WaitGroup
	sets := &setLog{acked: map[string]int64{}, failed: map[string]bool{}}
	locks := &lockLog{acked: map[string]bool{}}
	for _, f := range []func(){
		func() { writeSets(actx, pWrite.Config(), sets) },
		func() { regs.run(actx) },
		func() { contend(actx, "A", lockA, locks) },
		func() { contend(actx, "B", lockB, locks) },
	} {
		actors.Add(1)
		go func() {
			defer actors.Done()
			f()
		}()
	}

	var problems []string
	kills, err := killLeaders(ctx, cl, Size(1, 2), warm, down, after)
	if err != nil {
		problems = append(problems, fmt.Sprintf("fault: %v", err))
	}
	stopActors()
	actors.Wait()

	// Registrations recovered: Discover lists each instance with the info
	// of its last acknowledged Register.
	want := regs.expected()
	got, err := awaitDiscover(ctx, pWatch.Registry(), want, 20*time.Second)
	if err != nil {
		problems = append(problems, fmt.Sprintf("registrations after recovery: %v", err))
	}
	recovered := 0
	for _, g := range got {
		if w, ok := want[g.ID]; ok && w == g.Metadata["gen"] {
			recovered++
		}
	}

	// Final writes, one per kind of watch, then one that closes the history.
	if err := finalWrites(ctx, pWrite, pReg); err != nil {
		t.Fatalf("final writes: %v", err)
	}
	for _, w := range watchers {
		if err := w.awaitFinal(30 * time.Second); err != nil {
			problems = append(problems, err.Error())
		}
	}
	endResp, err := raw.Put(ctx, ns+"end", "")
	if err != nil {
		t.Fatalf("write end of history: %v", err)
	}
	hist, err := history(ctx, raw, ns, startRev, endResp.Header.Revision)
	if err != nil {
		t.Fatalf("read etcd's history: %v", err)
	}
	endWatches()
	for _, w := range watchers {
		<-w.reg.done
		<-w.cfg.done
	}

	var events, regEvents, missed, repeated, reordered, resyncs, unackedApplied int
	for i, w := range watchers {
		cj := judgeConfig(hist, ns, w.cfg.all(), sets)
		rj := judgeRegistry(hist, ns, w.reg.all())
		events, regEvents, resyncs = events+cj.events, regEvents+rj.events, resyncs+cj.resyncs
		missed, repeated, reordered = missed+cj.missed+rj.missed, repeated+cj.repeated+rj.repeated, reordered+cj.reordered+rj.reordered
		for _, p := range append(cj.problems, rj.problems...) {
			problems = append(problems, w.name+" watch: "+p)
		}
		if i == 0 {
			unackedApplied = cj.unackedApplied
		}
	}
	lj := judgeLock(hist, ns, locks)
	problems = append(problems, lj.problems...)

	line := fmt.Sprintf("scenario=etcd-leader-loss events=%d registry_events=%d missed=%d repeated=%d reordered=%d resyncs=%d"+
		" sets_acked=%d sets_failed=%d sets_unacked_applied=%d"+
		" holds=%d holds_lost=%d guarded_writes=%d lock_overlaps=%d unfenced_writes=%d stale_writes_rejected=%d stale_writes_unjudged=%d"+
		" registrations=%d/%d watch_restarts=%.0f lease_losses=%s"+
		" leader_killed=%s new_leader=%s new_leader_after=%s duration=%s",
		events, regEvents, missed, repeated, reordered, resyncs,
		len(sets.acked), len(sets.failed), unackedApplied,
		len(locks.holds), locks.lost(), len(locks.acked), lj.overlaps, lj.unfenced, lj.staleRejected, locks.staleUnsure,
		recovered, len(want), gathered(reg, "kfpipe_coord_watch_restarts_total")[""], leaseLosses(reg),
		joinKills(kills, func(k leaderKill) string { return fmt.Sprintf("member%d", k.killed) }),
		joinKills(kills, func(k leaderKill) string { return fmt.Sprintf("member%d", k.elected) }),
		joinKills(kills, func(k leaderKill) string { return k.electedAfter.Round(100 * time.Millisecond).String() }),
		time.Since(began).Round(100*time.Millisecond))
	if len(problems) > 0 {
		line += fmt.Sprintf(" problems=%d", len(problems))
	}
	printScenarioLine(t, line)
	for _, p := range problems {
		t.Errorf("etcd-leader-loss: %s", p)
	}
}

// leaderKill is one kill of the leader and the election that followed.
type leaderKill struct {
	killed, elected int // members
	electedAfter    time.Duration
}

// killLeaders kills the leader with SIGKILL kills times, warm after the
// start: each time it waits for the next leader, resumes the dead member
// down after the kill, and lets the whole cluster run for after.
func killLeaders(ctx context.Context, cl *EtcdCluster, kills int, warm, down, after time.Duration) ([]leaderKill, error) {
	var out []leaderKill
	if !Pause(ctx, warm, warm) {
		return out, ctx.Err()
	}
	for range kills {
		leader := cl.Leader(ctx, time.Second)
		if leader == 0 {
			return out, errors.New("no etcd leader before the kill")
		}
		at := time.Now()
		if err := cl.Kill9(leader); err != nil {
			return out, err
		}
		next, err := cl.AwaitLeader(ctx, leader, 30*time.Second)
		if err != nil {
			return out, err
		}
		out = append(out, leaderKill{killed: leader, elected: next, electedAfter: time.Since(at)})
		if !Pause(ctx, time.Until(at.Add(down)), time.Until(at.Add(down))) {
			return out, ctx.Err()
		}
		if err := cl.Resume(leader); err != nil {
			return out, err
		}
		if !Pause(ctx, after, after) {
			return out, ctx.Err()
		}
	}
	return out, nil
}

func joinKills(ks []leaderKill, f func(leaderKill) string) string {
	parts := make([]string, len(ks))
	for i, k := range ks {
		parts[i] = f(k)
	}
	return strings.Join(parts, ",")
}

// watcher is one Provider's Registry Watch of the service and WatchPrefix
// of the writer's prefix, recorded.
type watcher struct {
	name string
	reg  *recorder[coord.RegistryEvent]
	cfg  *recorder[coord.Event[int]]
}

func startWatcher(t *testing.T, ctx context.Context, name string, p *coord.Provider) *watcher {
	t.Helper()
	regCh, err := p.Registry().Watch(ctx, svcName)
	if err != nil {
		t.Fatalf("%s registry watch: %v", name, err)
	}
	cfgCh, err := coord.WatchPrefix[int](ctx, p.Config(), "w/")
	if err != nil {
		t.Fatalf("%s config watch: %v", name, err)
	}
	return &watcher{
		name: name,
		reg:  record(regCh, func(e coord.RegistryEvent) bool { return e.Service.ID == sentinelID }),
		cfg:  record(cfgCh, func(e coord.Event[int]) bool { return e.Key == sentinelKey }),
	}
}

// awaitFinal waits until both watches delivered the final writes.
func (w *watcher) awaitFinal(within time.Duration) error {
	timeout := time.After(within)
	for what, found := range map[string]<-chan struct{}{"registry": w.reg.found, "config": w.cfg.found} {
		select {
		case <-found:
		case <-timeout:
			return fmt.Errorf("%s %s watch did not deliver the final write within %s", w.name, what, within)
		}
	}
	return nil
}

// Names and timings of the scenario's actors.
const (
	svcName     = "svc"
	sentinelID  = "end"   // instance registered last: the registry watch has caught up
	sentinelKey = "w/end" // key Set last: the config watch has caught up
	lockKey     = "job"
	fencedKey   = "fenced" // what the lock holders write through GuardedPut
	regTTL      = 3 * time.Second
	lockTTL     = 2 * time.Second
	callTimeout = time.Second // of each Set, Register, Unlock
	// A holder's writes time out sooner: while one hangs the holder cannot
	// see its lock lost, and its hold would look longer than it was. (The
	// other contender gets the lock a second or more after the holder's
	// client gave its lease up: the new leader extends every lease by an
	// election timeout.)
	writeTimeout = 300 * time.Millisecond
	setEvery     = 50 * time.Millisecond
	holdFor      = 300 * time.Millisecond
)

// printScenarioLine prints line as Finish does: t.Log, stdout and the
// EnvReport file.
func printScenarioLine(t *testing.T, line string) {
	t.Helper()
	t.Log(line)
	reportMu.Lock()
	defer reportMu.Unlock()
	fmt.Println(line)
	if path := os.Getenv(EnvReport); path != "" {
		if f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			_, _ = fmt.Fprintln(f, line)
			_ = f.Close()
		}
	}
}

// recorder keeps what a watch channel delivered until it is closed.
type recorder[E any] struct {
	mu     sync.Mutex
	events []E
	found  chan struct{} // closed at the first event last accepts
	done   chan struct{} // closed when the channel closed
}

func record[E any](ch <-chan E, last func(E) bool) *recorder[E] {
	r := &recorder[E]{found: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		seen := false
		for e := range ch {
			r.mu.Lock()
			r.events = append(r.events, e)
			r.mu.Unlock()
			if !seen && last(e) {
				seen = true
				close(r.found)
			}
		}
	}()
	return r
}

func (r *recorder[E]) all() []E {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// setLog is what the writer was told: the revision of each acknowledged
// Set, and the keys whose Set failed (which may or may not have applied).
type setLog struct {
	mu     sync.Mutex
	acked  map[string]int64
	failed map[string]bool
}

// writeSets Sets a new key w/<n> to n every setEvery until ctx ends.
func writeSets(ctx context.Context, cc *coord.ConfigCenter, log *setLog) {
	tick := time.NewTicker(setEvery)
	defer tick.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		key := fmt.Sprintf("w/%06d", n)
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		rev, err := coord.Set(cctx, cc, key, n)
		cancel()
		log.mu.Lock()
		if err == nil {
			log.acked[key] = rev
		} else {
			log.failed[key] = true
		}
		log.mu.Unlock()
	}
}

// registrar registers instance i1 again with a new generation in its
// metadata every half second, so the registry watch has changes to report
// while the leader is down.
type registrar struct {
	p *coord.Provider

	mu  sync.Mutex
	gen int // of i1's last acknowledged Register
}

// instance is the info of instance id at generation gen.
func instance(id string, gen int) coord.ServiceInfo {
	return coord.ServiceInfo{Name: svcName, ID: id, Addr: "127.0.0.1:1", Metadata: map[string]string{"gen": strconv.Itoa(gen)},
		StartedAt: time.Unix(1_700_000_000, 0)}
}

func (r *registrar) run(ctx context.Context) {
	for gen := 1; Pause(ctx, 500*time.Millisecond, 500*time.Millisecond); gen++ {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		err := r.p.Registry().Register(cctx, instance("i1", gen), regTTL)
		cancel()
		if err == nil {
			r.mu.Lock()
			r.gen = gen
			r.mu.Unlock()
		}
	}
}

// expected returns the generation each instance must be registered with.
func (r *registrar) expected() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return map[string]string{"i1": strconv.Itoa(r.gen), "i2": "0", "i3": "0"}
}

// awaitDiscover polls Discover until it lists exactly want (ID ->
// generation) or within has passed; it returns the last listing.
func awaitDiscover(ctx context.Context, r *coord.Registry, want map[string]string, within time.Duration) ([]coord.ServiceInfo, error) {
	deadline := time.Now().Add(within)
	for {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		got, err := r.Discover(cctx, svcName)
		cancel()
		if err == nil {
			have := map[string]string{}
			for _, g := range got {
				have[g.ID] = g.Metadata["gen"]
			}
			if maps.Equal(have, want) {
				return got, nil
			}
			err = fmt.Errorf("listed %v (ID: generation), want %v", have, want)
		}
		if time.Now().After(deadline) {
			return got, fmt.Errorf("%w (after %s)", err, within)
		}
		if !Pause(ctx, 100*time.Millisecond, 100*time.Millisecond) {
			return got, ctx.Err()
		}
	}
}

// finalWrites Sets the config sentinel and registers the registry
// sentinel, retrying each until it is acknowledged.
func finalWrites(ctx context.Context, pWrite, pReg *coord.Provider) error {
	deadline := time.Now().Add(20 * time.Second)
	for _, write := range []func(context.Context) error{
		func(c context.Context) error { _, err := coord.Set(c, pWrite.Config(), sentinelKey, 0); return err },
		func(c context.Context) error {
			return pReg.Registry().Register(c, coord.ServiceInfo{Name: svcName, ID: sentinelID, Addr: "127.0.0.1:1"}, regTTL)
		},
	} {
		for {
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			err := write(cctx)
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return err
			}
			Pause(ctx, 100*time.Millisecond, 100*time.Millisecond)
		}
	}
	return nil
}

// hold is one acquisition of the lock as its contender saw it: from
// Acquire's return to just before Unlock (or to the moment it saw the
// lock lost).
type hold struct {
	who      string
	fence    int64
	from, to time.Time
	lost     bool
}

// lockLog is what the contenders did.
type lockLog struct {
	mu    sync.Mutex
	n     int
	holds []hold
	acked map[string]bool // values of acknowledged guarded writes
	// Writes with the token of an ended hold: rejected (ErrFenced),
	// accepted (a failure), or failed otherwise (the history decides).
	staleRejected, staleAccepted, staleUnsure int
}

// lost counts the holds that ended because the lock was lost.
func (l *lockLog) lost() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, h := range l.holds {
		if h.lost {
			n++
		}
	}
	return n
}

func (l *lockLog) next(who string, fence int64, stale bool) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	return fmt.Sprintf("%s %d %d %t", who, fence, l.n, stale)
}

// contend takes the lock, writes through GuardedPut every 50 ms for
// holdFor, unlocks, writes once more with the old token, and starts over,
// until ctx ends.
func contend(ctx context.Context, who string, l *coord.Lock, log *lockLog) {
	for ctx.Err() == nil {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := l.Acquire(actx)
		cancel()
		if err != nil {
			Pause(ctx, 50*time.Millisecond, 50*time.Millisecond)
			continue
		}
		h := hold{who: who, fence: l.FencingToken(), from: time.Now()}
		for end := h.from.Add(holdFor); time.Now().Before(end) && ctx.Err() == nil; {
			select {
			case <-l.Done():
				h.lost = true
			default:
			}
			if h.lost {
				break
			}
			val := log.next(who, h.fence, false)
			wctx, cancel := context.WithTimeout(ctx, writeTimeout)
			err := l.GuardedPut(wctx, h.fence, fencedKey, val)
			cancel()
			if errors.Is(err, coord.ErrFenced) {
				h.lost = true
				break
			}
			if err == nil {
				log.mu.Lock()
				log.acked[val] = true
				log.mu.Unlock()
			}
			time.Sleep(50 * time.Millisecond)
		}
		h.to = time.Now()
		uctx, cancel := context.WithTimeout(context.Background(), 2*callTimeout)
		uerr := l.Unlock(uctx)
		cancel()
		// The hold has ended for etcd when Unlock revoked the lease or the
		// lease was gone already; after any other Unlock error the key may
		// still be there, so the history alone judges that write.
		judged := uerr == nil || errors.Is(uerr, coord.ErrNotHeld)
		h.lost = h.lost || errors.Is(uerr, coord.ErrNotHeld)
		sctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		serr := l.GuardedPut(sctx, h.fence, fencedKey, log.next(who, h.fence, true))
		cancel()
		log.mu.Lock()
		log.holds = append(log.holds, h)
		switch {
		case !judged:
			log.staleUnsure++
		case errors.Is(serr, coord.ErrFenced):
			log.staleRejected++
		case serr == nil:
			log.staleAccepted++
		default:
			log.staleUnsure++
		}
		log.mu.Unlock()
	}
}

// history returns the events under prefix with revisions in (from, to],
// as etcd stored them; an event at revision to must exist.
func history(ctx context.Context, cli *clientv3.Client, prefix string, from, to int64) ([]*clientv3.Event, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out []*clientv3.Event
	for wr := range cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from+1)) {
		if err := wr.Err(); err != nil {
			return nil, err
		}
		for _, ev := range wr.Events {
			out = append(out, ev)
			if ev.Kv.ModRevision >= to {
				return out, nil
			}
		}
	}
	return nil, fmt.Errorf("history of %s: watch ended before revision %d: %w", prefix, to, ctx.Err())
}

// configJudgement compares what the config watch delivered with etcd's
// history of its prefix and with the writer's acknowledgements.
type configJudgement struct {
	events, missed, repeated, reordered, resyncs, unackedApplied int
	problems                                                     []string
}

func judgeConfig(hist []*clientv3.Event, ns string, got []coord.Event[int], sets *setLog) configJudgement {
	var j configJudgement
	dir := ns + "config/"
	truth := map[int64]*clientv3.Event{} // by revision: one write per revision here
	for _, ev := range hist {
		if strings.HasPrefix(string(ev.Kv.Key), dir+"w/") {
			truth[ev.Kv.ModRevision] = ev
		}
	}
	if len(got) == 0 || got[0].Type != coord.EventResync || len(got[0].Snapshot) != 0 {
		j.problems = append(j.problems, "config watch did not start with an empty resync")
		return j
	}
	last := got[0].Version // revision of the last delivered event
	var coveredTo int64    // a resync stands for every change up to its revision
	delivered := map[int64]int{}
	for _, e := range got[1:] {
		if e.Type == coord.EventResync {
			j.resyncs++
			coveredTo = max(coveredTo, e.Version)
			last = max(last, e.Version)
			continue
		}
		switch {
		case delivered[e.Version] > 0:
			j.repeated++
		case e.Version <= last:
			j.reordered++
		}
		delivered[e.Version]++
		last = max(last, e.Version)
		if e.Type == coord.EventPut {
			j.events++
		}
		ev, ok := truth[e.Version]
		if !ok || string(ev.Kv.Key) != dir+e.Key || (e.Type == coord.EventPut) != (ev.Type == mvccpb.PUT) ||
			(e.Type == coord.EventPut && string(ev.Kv.Value) != strconv.Itoa(e.Value)) {
			j.problems = append(j.problems, fmt.Sprintf("config watch delivered %v %s=%d at %d, which is not in etcd's history",
				e.Type, e.Key, e.Value, e.Version))
		}
	}
	for rev := range truth {
		if delivered[rev] == 0 && rev > coveredTo {
			j.missed++
		}
	}
	sets.mu.Lock()
	defer sets.mu.Unlock()
	applied := map[string]bool{}
	for _, ev := range truth {
		applied[strings.TrimPrefix(string(ev.Kv.Key), dir)] = true
	}
	for key, rev := range sets.acked {
		if ev, ok := truth[rev]; !ok || string(ev.Kv.Key) != dir+key {
			j.problems = append(j.problems, fmt.Sprintf("acknowledged Set of %s at revision %d is not in etcd's history", key, rev))
		}
	}
	for key := range sets.failed {
		if applied[key] {
			j.unackedApplied++
		}
	}
	return j
}

// registryJudgement compares what the registry watch delivered with the
// events etcd's history of the service's keys implies.
type registryJudgement struct {
	events, missed, repeated, reordered int
	problems                            []string
}

func judgeRegistry(hist []*clientv3.Event, ns string, got []coord.RegistryEvent) registryJudgement {
	var j registryJudgement
	// What the watch must report, replayed from history the way it reports
	// it: a put of the value already reported is no change.
	describe := func(typ coord.RegistryEventType, info coord.ServiceInfo) string {
		return fmt.Sprintf("%v %s gen=%s", typ, info.ID, info.Metadata["gen"])
	}
	var want []string
	state := map[string]string{}
	for _, ev := range hist {
		k := string(ev.Kv.Key)
		if !strings.HasPrefix(k, ns+"services/"+svcName+"/") {
			continue
		}
		old, had := state[k]
		var info coord.ServiceInfo
		switch {
		case ev.Type == mvccpb.DELETE && had:
			_ = json.Unmarshal([]byte(old), &info)
			want = append(want, describe(coord.ServiceRemoved, info))
			delete(state, k)
		case ev.Type == mvccpb.PUT && (!had || old != string(ev.Kv.Value)):
			_ = json.Unmarshal(ev.Kv.Value, &info)
			typ := coord.ServiceAdded
			if had {
				typ = coord.ServiceUpdated
			}
			want = append(want, describe(typ, info))
			state[k] = string(ev.Kv.Value)
		}
		if ev.Type == mvccpb.PUT && info.ID == sentinelID {
			break // the history goes on past what the watch was asked for
		}
	}
	var have []string
	for _, e := range got {
		have = append(have, describe(e.Type, e.Service))
		if e.Service.ID == sentinelID {
			break
		}
	}
	j.events = len(have)
	if slices.Equal(have, want) {
		return j
	}
	count := map[string]int{}
	for _, w := range want {
		count[w]++
	}
	for _, h := range have {
		count[h]--
	}
	for _, c := range count {
		if c > 0 {
			j.missed += c
		} else {
			j.repeated -= c
		}
	}
	if j.missed == 0 && j.repeated == 0 {
		j.reordered = 1
	}
	j.problems = append(j.problems, fmt.Sprintf("registry watch delivered\n  %s\nwant (from etcd's history)\n  %s",
		strings.Join(have, "\n  "), strings.Join(want, "\n  ")))
	return j
}

// lockJudgement checks the holds the contenders saw against each other and
// the guarded writes against the holders etcd's history shows.
type lockJudgement struct {
	overlaps, unfenced, staleRejected int
	problems                          []string
}

func judgeLock(hist []*clientv3.Event, ns string, log *lockLog) lockJudgement {
	log.mu.Lock()
	defer log.mu.Unlock()
	j := lockJudgement{staleRejected: log.staleRejected}
	holds := slices.Clone(log.holds)
	slices.SortFunc(holds, func(a, b hold) int { return a.from.Compare(b.from) })
	var latest hold // of the holds before holds[i], the one that ended last
	for i, h := range holds {
		if i > 0 && h.from.Before(latest.to) {
			j.overlaps++
			j.problems = append(j.problems, fmt.Sprintf("holds overlap: %s token %d until %s, %s token %d from %s",
				latest.who, latest.fence, latest.to.Format("15:04:05.000"), h.who, h.fence, h.from.Format("15:04:05.000")))
		}
		if h.to.After(latest.to) {
			latest = h
		}
	}
	if log.staleAccepted > 0 {
		j.problems = append(j.problems, fmt.Sprintf("%d writes with the token of an ended hold were accepted", log.staleAccepted))
	}
	// Replay the waiters' keys: the holder at any revision is the existing
	// waiter with the lowest create revision (its token).
	waiters := map[string]int64{}
	holder := func() int64 {
		var h int64
		for _, c := range waiters {
			if h == 0 || c < h {
				h = c
			}
		}
		return h
	}
	written := map[string]bool{}
	for _, ev := range hist {
		k := string(ev.Kv.Key)
		switch {
		case strings.HasPrefix(k, ns+"locks/"+lockKey+"/"):
			if ev.Type == mvccpb.DELETE {
				delete(waiters, k)
			} else if ev.IsCreate() {
				waiters[k] = ev.Kv.CreateRevision
			}
		case k == ns+fencedKey:
			val := string(ev.Kv.Value)
			written[val] = true
			var who string
			var fence int64
			var n int
			var stale bool
			if _, err := fmt.Sscanf(val, "%s %d %d %t", &who, &fence, &n, &stale); err != nil {
				j.problems = append(j.problems, fmt.Sprintf("unexpected guarded value %q", val))
				continue
			}
			if h := holder(); fence != h {
				j.unfenced++
				j.problems = append(j.problems, fmt.Sprintf("guarded write %q applied at revision %d while the holder's token was %d",
					val, ev.Kv.ModRevision, h))
			}
		}
	}
	for val := range log.acked {
		if !written[val] {
			j.problems = append(j.problems, fmt.Sprintf("acknowledged guarded write %q is not in etcd's history", val))
		}
	}
	return j
}

// gathered returns the values of the counter family name in reg by the
// value of its only label ("" when it has none).
func gathered(reg *prometheus.Registry, name string) map[string]float64 {
	out := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			label := ""
			if ls := m.GetLabel(); len(ls) > 0 {
				label = ls[0].GetValue()
			}
			out[label] += m.GetCounter().GetValue()
		}
	}
	return out
}

// leaseLosses is kfpipe_coord_lease_losses_total as "N" or
// "N(kind:n,…)" over the kinds that lost any.
func leaseLosses(reg *prometheus.Registry) string {
	byKind := gathered(reg, "kfpipe_coord_lease_losses_total")
	var total float64
	var parts []string
	for _, kind := range slices.Sorted(maps.Keys(byKind)) {
		if n := byKind[kind]; n > 0 {
			total += n
			parts = append(parts, fmt.Sprintf("%s:%.0f", kind, n))
		}
	}
	if len(parts) == 0 {
		return "0"
	}
	return fmt.Sprintf("%.0f(%s)", total, strings.Join(parts, ","))
}
