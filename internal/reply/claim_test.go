package reply_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/overload"
	"github.com/kfpipe/kfpipe/internal/reply"
	"github.com/kfpipe/kfpipe/internal/state"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

// ownerLog is a partition lease on the test Redis as the consumer gives it
// to a handler: its reply log, which knows its deadline and claims replies
// (what package service adapts). deadline, when set, replaces the lease's
// own (an owner past it).
type ownerLog struct {
	l        *state.Lease
	deadline time.Time
}

func item(it handler.StateItem) state.Item {
	return state.Item{Key: it.Key, SendTime: it.SendTime, User: it.User}
}

func (o *ownerLog) Lost() <-chan struct{} { return o.l.Lost() }
func (o *ownerLog) Deadline() time.Time {
	if !o.deadline.IsZero() {
		return o.deadline
	}
	return o.l.Deadline()
}
func (o *ownerLog) Replied(ctx context.Context, it handler.StateItem) (string, bool, error) {
	return o.l.Replied(ctx, item(it))
}
func (o *ownerLog) RecordReply(ctx context.Context, it handler.StateItem, record string) error {
	return o.l.RecordClaimedReply(ctx, item(it), record)
}
func (o *ownerLog) ClaimReply(ctx context.Context, it handler.StateItem, hold time.Duration) (string, bool, time.Duration, error) {
	return o.l.ClaimReply(ctx, item(it), hold)
}

// claimRig: the fake WeChat, one message to answer, and two owners' state
// stores on the test Redis.
type claimRig struct {
	fake   *wecomtest.Server
	fx     *reply.Effects
	to     reply.Target
	stores [2]*state.Store
}

func newClaimRig(t *testing.T) *claimRig {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	fake := wecomtest.New(wecomtest.Options{Accounts: []string{"wk"}})
	t.Cleanup(fake.Close)
	kc, err := kf.New(kf.Config{BaseURL: fake.URL(), CorpID: fake.CorpID(), Secret: fake.Secret()})
	if err != nil {
		t.Fatal(err)
	}
	id := fake.AddText("wk", "u1", "hi")
	rig := &claimRig{fake: fake, fx: reply.New(kc, nil),
		to: reply.Target{OpenKfID: "wk", UpstreamMsgID: id, User: "u1", SendTime: time.Now().Unix()}}
	for i, owner := range []string{"a", "b"} {
		rig.stores[i], err = state.New(context.Background(), state.Config{Client: rdb, KeyPrefix: prefix, Owner: owner,
			Lease: 3 * time.Second, TTL: reply.TTL})
		if err != nil {
			t.Fatal(err)
		}
	}
	return rig
}

func (rig *claimRig) acquire(t *testing.T, i int) *state.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := rig.stores[i].Acquire(ctx, "main", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

// sends is every send_msg WeChat received for the rig's customer,
// repeats of a msgid included.
func (rig *claimRig) sends() int {
	return len(rig.fake.Replies("wk", "u1")) + rig.fake.DuplicateMsgIDs()
}

// sendText is a handler's reply: it waits for gate (nil: no wait) before
// the request leaves.
func sendText(gate <-chan struct{}, sending chan<- struct{}) reply.Send {
	return func(ctx context.Context, kc *kf.Client, to reply.Target, msgID string) error {
		if sending != nil {
			close(sending)
		}
		if gate != nil {
			<-gate
		}
		_, err := kc.Send(ctx, to.OpenKfID, to.User, msgID, kf.Text{Content: "hello"})
		return err
	}
}

// TestNewerOwnerWaitsOnOlderClaim: two owners of one message at once — the
// partition's lease moved to B while A's handler is still sending its
// reply (a paused A resumed, a handler that outlived its hand-over). B's
// run of the same reply waits on A's live claim and finds A's record: one
// send. A third, older owner meeting B's claim is told, and sends
// nothing. Before, B looked up, found nothing and sent beside A.
func TestNewerOwnerWaitsOnOlderClaim(t *testing.T) {
	rig := newClaimRig(t)
	la := rig.acquire(t, 0)
	gate, sending := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		ctx := reply.With(handler.WithReplyLog(context.Background(), &ownerLog{l: la}), rig.fx, rig.to)
		aDone <- reply.Do(ctx, "reply", sendText(gate, sending))
	}()
	<-sending
	// The lease moves to B while A's send is under way.
	if err := la.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	lb := rig.acquire(t, 1)
	if lb.Token() <= la.Token() {
		t.Fatalf("B's token %d not above A's %d", lb.Token(), la.Token())
	}
	bDone := make(chan error, 1)
	go func() {
		ctx := reply.With(handler.WithReplyLog(context.Background(), &ownerLog{l: lb}), rig.fx, rig.to)
		bDone <- reply.Do(ctx, "reply", sendText(nil, nil))
	}()
	time.Sleep(500 * time.Millisecond)
	close(gate) // A's request leaves now
	if err := <-aDone; err != nil {
		t.Fatalf("A: %v", err)
	}
	select {
	case err := <-bDone:
		if err != nil {
			t.Fatalf("B: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("B still waiting after A's record")
	}
	if n := rig.sends(); n != 1 {
		t.Fatalf("WeChat received %d sends of the reply, want 1", n)
	}
	if sent, skipped, _, _ := rig.fx.Counts(); sent != 1 || skipped != 1 {
		t.Fatalf("sent %d skipped %d, want 1 and 1", sent, skipped)
	}

	// An older owner meets a newer owner's claim (of the next reply): it
	// is told, and sends nothing.
	rig.to.UpstreamMsgID = rig.fake.AddText("wk", "u1", "again")
	bGate, bSending := make(chan struct{}), make(chan struct{})
	go func() {
		ctx := reply.With(handler.WithReplyLog(context.Background(), &ownerLog{l: lb}), rig.fx, rig.to)
		bDone <- reply.Do(ctx, "reply", sendText(bGate, bSending))
	}()
	<-bSending
	old := &ownerLog{l: la, deadline: time.Now().Add(time.Minute)} // it believes it still owns it
	ctx := reply.With(handler.WithReplyLog(context.Background(), old), rig.fx, rig.to)
	var called atomic.Bool
	err := reply.Do(ctx, "reply", func(context.Context, *kf.Client, reply.Target, string) error {
		called.Store(true)
		return nil
	})
	close(bGate)
	if !errors.Is(err, handler.ErrNotOwner) || called.Load() {
		t.Fatalf("older owner: err %v, sent %v; want ErrNotOwner and no send", err, called.Load())
	}
	if err := <-bDone; err != nil {
		t.Fatalf("B: %v", err)
	}
}

// TestReplyRecordedAfterOwnershipLost: the handler's context is cancelled
// (its partition's lease was lost) just after WeChat accepted the reply.
// The reply is still recorded — a reply sent is a fact — so a later run
// of the handler does not send it again. Before, the record used the
// handler's cancelled context and failed.
func TestReplyRecordedAfterOwnershipLost(t *testing.T) {
	rig := newClaimRig(t)
	la := rig.acquire(t, 0)
	ctx, cancel := context.WithCancel(context.Background())
	ctx = reply.With(handler.WithReplyLog(ctx, &ownerLog{l: la}), rig.fx, rig.to)
	err := reply.Do(ctx, "reply", func(ctx context.Context, kc *kf.Client, to reply.Target, msgID string) error {
		err := sendText(nil, nil)(ctx, kc, to, msgID)
		cancel() // ownership lost as the answer came back
		return err
	})
	if err != nil {
		t.Fatalf("reply: %v", err)
	}
	_, found, err := la.Replied(context.Background(), state.Item{Key: rig.to.OpenKfID + ":" + rig.to.UpstreamMsgID + ":0", SendTime: rig.to.SendTime})
	if err != nil || !found {
		t.Fatalf("reply not recorded (found %v, %v)", found, err)
	}
	// The next owner's run finds it.
	lb := func() *state.Lease { _ = la.Release(context.Background()); return rig.acquire(t, 1) }()
	ctx = reply.With(handler.WithReplyLog(context.Background(), &ownerLog{l: lb}), rig.fx, rig.to)
	if err := reply.Do(ctx, "reply", sendText(nil, nil)); err != nil {
		t.Fatal(err)
	}
	if n := rig.sends(); n != 1 {
		t.Fatalf("WeChat received %d sends, want 1", n)
	}
}

// TestNoReplyPastLeaseDeadline: a handler whose partition's lease is past
// its local deadline (a paused owner, resumed) sends no reply: the reply
// returns ErrNotOwner (the consumer then looks the message up again under
// the next lease). Before, it was sent under a lease another owner could
// already hold.
func TestNoReplyPastLeaseDeadline(t *testing.T) {
	rig := newClaimRig(t)
	la := rig.acquire(t, 0)
	ctx := reply.With(handler.WithReplyLog(context.Background(), &ownerLog{l: la, deadline: time.Now().Add(-time.Millisecond)}), rig.fx, rig.to)
	err := reply.Do(ctx, "reply", sendText(nil, nil))
	if !errors.Is(err, handler.ErrNotOwner) {
		t.Fatalf("reply past the lease's deadline: %v, want ErrNotOwner", err)
	}
	if n := rig.sends(); n != 0 {
		t.Fatalf("WeChat received %d sends, want 0", n)
	}
}

// TestReplyInFlightNotCutByLeaseLoss: the handler's lease is lost (its
// context cancelled) while its reply's send_msg is at WeChat, which
// delivered it and is still answering. The send is not cut: it ends with
// WeChat's answer and is recorded, so the next run of the handler finds
// it. Before, the lost lease cancelled the request in flight, the reply
// was counted failed with WeChat having delivered it, and the next run
// sent it again — the nemesis's "reply sent twice" (WeChat msgid … first
// 17:35:09.987, again 17:35:10.394).
func TestReplyInFlightNotCutByLeaseLoss(t *testing.T) {
	rig := newClaimRig(t)
	rig.fake.DelayAnswers(wecomtest.APISendMsg, 300*time.Millisecond)
	la := rig.acquire(t, 0)
	ctx, lose := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- reply.Do(reply.With(handler.WithReplyLog(ctx, &ownerLog{l: la}), rig.fx, rig.to), "reply", sendText(nil, nil))
	}()
	for deadline := time.Now().Add(10 * time.Second); len(rig.fake.Replies("wk", "u1")) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the reply never reached WeChat")
		}
	}
	lose() // the lease is lost while WeChat's answer is on its way
	if err := <-done; err != nil {
		t.Fatalf("a reply WeChat delivered: %v", err)
	}
	rig.fake.DelayAnswers(wecomtest.APISendMsg, 0)
	// The next owner's run of the handler.
	_ = la.Release(context.Background())
	lb := rig.acquire(t, 1)
	if err := reply.Do(reply.With(handler.WithReplyLog(context.Background(), &ownerLog{l: lb}), rig.fx, rig.to), "reply", sendText(nil, nil)); err != nil {
		t.Fatal(err)
	}
	if n := rig.sends(); n != 1 {
		t.Fatalf("WeChat received %d sends of the reply, want 1", n)
	}
	if sent, skipped, _, failed := rig.fx.Counts(); sent != 1 || skipped != 1 || failed != 0 {
		t.Fatalf("sent %d skipped %d failed %d, want 1, 1, 0", sent, skipped, failed)
	}
}

// TestReplyWaitingForASlotPastTheLease: a reply that waited for a slot
// under the replies' limit until its lease's deadline had passed is not
// sent: the lease is checked again as the request leaves (its send no
// longer ends with the lease, so the check before the wait is not
// enough).
func TestReplyWaitingForASlotPastTheLease(t *testing.T) {
	rig := newClaimRig(t)
	lim := overload.New(overload.Config{Initial: 1, Min: 1, Max: 1, Tolerance: 1.3, Backoff: 0.75}, nil)
	kc, err := kf.New(kf.Config{BaseURL: rig.fake.URL(), CorpID: rig.fake.CorpID(), Secret: rig.fake.Secret()})
	if err != nil {
		t.Fatal(err)
	}
	fx := reply.New(kc, nil, reply.WithLimiter(lim))
	// The one slot is taken until release.
	release, held := make(chan struct{}), make(chan struct{})
	go func() {
		_ = lim.Call(context.Background(), func() error { close(held); <-release; return nil }, nil)
	}()
	<-held
	la := rig.acquire(t, 0)
	owner := &ownerLog{l: la, deadline: time.Now().Add(300 * time.Millisecond)}
	done := make(chan error, 1)
	go func() {
		done <- reply.Do(reply.With(handler.WithReplyLog(context.Background(), owner), fx, rig.to), "reply", sendText(nil, nil))
	}()
	time.Sleep(600 * time.Millisecond) // past the deadline, still waiting for the slot
	close(release)
	if err := <-done; !errors.Is(err, handler.ErrNotOwner) {
		t.Fatalf("a reply whose slot came after its lease's deadline: %v, want ErrNotOwner", err)
	}
	if n := rig.sends(); n != 0 {
		t.Fatalf("WeChat received %d sends, want 0", n)
	}
}
