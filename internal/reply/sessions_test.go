package reply_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/reply"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

// roundTrips counts the commands sent alone and the pipelines a client
// sends: its round trips.
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "hello" && cmd.Name() != "client" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if name := cmds[0].Name(); name != "hello" && name != "client" {
			h.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// TestSessionStateReadOncePerCall: a handler call reads its customer's
// session state once — asking again within the call costs no round trip
// and answers the same, even after the state changed meanwhile — and the
// message's kept state and the customer's cached one are read together:
// a new message of a customer whose state is cached costs two round trips
// (the read, and keeping the state with the message), not three.
func TestSessionStateReadOncePerCall(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	fake := wecomtest.New(wecomtest.Options{Accounts: []string{"wk"}})
	t.Cleanup(fake.Close)
	kc, err := kf.New(kf.Config{BaseURL: fake.URL(), CorpID: fake.CorpID(), Secret: fake.Secret()})
	if err != nil {
		t.Fatal(err)
	}
	first := fake.AddText("wk", "u1", "hi")
	second := fake.AddText("wk", "u1", "are you there?")
	fx := reply.New(kc, nil, reply.WithSessions(reply.NewSessions(rdb, prefix, 0)))
	rt := &roundTrips{}
	rdb.AddHook(rt)
	call := func(msgID string) context.Context {
		return reply.With(context.Background(), fx, reply.Target{OpenKfID: "wk", UpstreamMsgID: msgID, User: "u1", SendTime: time.Now().Unix()})
	}

	ctx := call(first)
	st, _, err := reply.SessionState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fake.SetSessionState("wk", "u1", int(kf.StateServicer), "alice")
	reply.ForgetSession(ctx) // as a Transfer by the handler would
	before := rt.n.Load()
	again, _, err := reply.SessionState(ctx)
	if err != nil || again != st {
		t.Fatalf("second read in the call: %d, %v; want the first read's %d", again, err, st)
	}
	if n := rt.n.Load() - before; n != 0 {
		t.Fatalf("second read in the call: %d round trips, want none", n)
	}

	// The next message: the customer's state is cached (the first read
	// cached WeChat's answer before the hand-off; the Forget above dropped
	// it, so cache the servicer's state as a fresh read would).
	if _, _, err := reply.SessionState(call("warm-" + second)); err != nil {
		t.Fatal(err)
	}
	before = rt.n.Load()
	got, servicer, err := reply.SessionState(call(second))
	if err != nil || got != kf.StateServicer || servicer != "alice" {
		t.Fatalf("next message: %d %q %v, want the servicer's state", got, servicer, err)
	}
	if n := rt.n.Load() - before; n != 2 {
		t.Fatalf("next message of a cached customer: %d round trips, want 2", n)
	}
}
