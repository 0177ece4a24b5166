package kfpipe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/consumer"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/reply"
	"github.com/kfpipe/kfpipe/internal/state"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

// replyRig is the reply side of a consumer on real Redis and the fake
// WeChat; cut, when set, stands between the two.
type replyRig struct {
	fake *wecomtest.Server
	fx   *reply.Effects
	reg  *prometheus.Registry
	logs *observer.ObservedLogs
	log  handler.ReplyLog
	cut  atomic.Pointer[func(w http.ResponseWriter, r *http.Request) bool]
}

func newReplyRig(t *testing.T) *replyRig {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	rig := &replyRig{fake: wecomtest.NewHandler(wecomtest.Options{Accounts: []string{"wk"}})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cut := rig.cut.Load(); cut != nil && (*cut)(w, r) {
			return
		}
		rig.fake.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	kc, err := kf.New(kf.Config{BaseURL: srv.URL, CorpID: rig.fake.CorpID(), Secret: rig.fake.Secret()})
	if err != nil {
		t.Fatal(err)
	}
	// The replies are kept where the consumer keeps them: in the
	// partition's lease of the state store.
	st, err := state.New(context.Background(), state.Config{Client: rdb, KeyPrefix: prefix, Lease: 2 * time.Second, TTL: reply.TTL})
	if err != nil {
		t.Fatal(err)
	}
	l, err := st.Acquire(context.Background(), "main", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	rig.log = leaseLog{l}
	core, logs := observer.New(zap.WarnLevel)
	rig.reg, rig.logs = prometheus.NewRegistry(), logs
	rig.fx = reply.New(kc, rig.reg, reply.WithLogger(zap.New(core)))
	return rig
}

// leaseLog is a state lease as the consumer's reply log.
type leaseLog struct{ l *state.Lease }

func (ll leaseLog) Replied(ctx context.Context, it handler.StateItem) (string, bool, error) {
	return ll.l.Replied(ctx, state.Item{Key: it.Key, SendTime: it.SendTime})
}

func (ll leaseLog) RecordReply(ctx context.Context, it handler.StateItem, record string) error {
	return ll.l.RecordReply(ctx, state.Item{Key: it.Key, SendTime: it.SendTime}, record)
}

// wrap is reply.Wrap with the rig's reply log in each call's context, as
// the consumer gives a handler its partition's lease.
func (rig *replyRig) wrap(h handler.Handler) handler.Handler {
	w := reply.Wrap(h, rig.fx)
	return handler.HandlerFunc(func(ctx context.Context, c *chatmsg.ChatMessage) error {
		return w.Handle(handler.WithReplyLog(ctx, rig.log), c)
	})
}

// message returns the chat message of the fake's upstream message id.
func (rig *replyRig) message(t *testing.T, id string) *chatmsg.ChatMessage {
	t.Helper()
	for _, m := range rig.fake.Messages("wk") {
		if m.UpstreamMsgID == id {
			m.MessageID = 1
			return m
		}
	}
	t.Fatalf("no message %s", id)
	return nil
}

// killSecondSend makes the fake's second send_msg never answer and
// cancels the handler's context instead: a consumer killed between two
// replies of one message.
func (rig *replyRig) killSecondSend(cancel context.CancelFunc) {
	var sends atomic.Int32
	f := func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/send_msg") || sends.Add(1) != 2 {
			return false
		}
		_, _ = io.Copy(io.Discard, r.Body) // so the server sees the client hang up
		cancel()
		select { // the client gives up (its context ended) or the test does
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
			http.Error(w, "cut off", http.StatusBadGateway)
		}
		return true
	}
	rig.cut.Store(&f)
}

// TestRerunHandlerRepliesOnce: a Go handler that replied once and was cut
// off before its second reply runs again; the first reply is not sent
// again, the second is, each once, in order.
func TestRerunHandlerRepliesOnce(t *testing.T) {
	rig := newReplyRig(t)
	c := rig.message(t, rig.fake.AddText("wk", "u1", "hi"))
	var calls atomic.Int32
	h := rig.wrap(adapt(HandlerFunc(func(ctx context.Context, m *Message) error {
		calls.Add(1)
		if err := Reply(ctx, kf.Text{Content: "one"}); err != nil {
			return err
		}
		return Reply(ctx, kf.Text{Content: "two"})
	})))
	ctx, cancel := context.WithCancel(context.Background())
	rig.killSecondSend(cancel)
	if err := h.Handle(ctx, c); err == nil {
		t.Fatal("the cut-off run succeeded")
	}
	rig.cut.Store(nil)
	for range 2 { // the re-run, and a redelivery after it finished
		if err := h.Handle(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	assertReplies(t, rig.fake, "u1", "one", "two")
	if sent, skipped, _, failed := rig.fx.Counts(); sent != 2 || skipped != 3 || failed != 1 {
		t.Fatalf("counts sent %d skipped %d failed %d, want 2, 3 and 1", sent, skipped, failed)
	}
	if calls.Load() != 3 {
		t.Fatalf("handler ran %d times", calls.Load())
	}
}

// TestDifferentReplyOnRerunIsReported: a handler that replies "one" and
// then, run again for the same message, "other" at the same position:
// the customer keeps "one" only, and the skipped reply is counted in
// kfpipe_reply_mismatch_total and logged with the message's ids. The same
// reply on a third run is not a mismatch.
func TestDifferentReplyOnRerunIsReported(t *testing.T) {
	rig := newReplyRig(t)
	id := rig.fake.AddText("wk", "u4", "hi")
	c := rig.message(t, id)
	texts := []string{"one", "other", "one"}
	var run atomic.Int32
	h := rig.wrap(adapt(HandlerFunc(func(ctx context.Context, m *Message) error {
		return Reply(ctx, kf.Text{Content: texts[run.Add(1)-1]})
	})))
	for range texts {
		if err := h.Handle(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	assertReplies(t, rig.fake, "u4", "one")
	if n, ok := testenv.Gathered(t, rig.reg, "kfpipe_reply_mismatch_total"); !ok || n != 1 || rig.fx.Mismatches() != 1 {
		t.Fatalf("kfpipe_reply_mismatch_total = %v (registered: %v, Mismatches %d), want 1", n, ok, rig.fx.Mismatches())
	}
	warns := rig.logs.FilterMessageSnippet("different reply").All()
	if len(warns) != 1 {
		t.Fatalf("%d mismatch warnings, want 1: %v", len(warns), rig.logs.All())
	}
	f := warns[0].ContextMap()
	if f["upstream_msgid"] != id || f["user_id"] != "u4" || f["reply"] != int64(0) {
		t.Fatalf("the warning does not name the message and reply: %v", f)
	}
}

// TestRoutineRefusalFinishesMessage: a handler that returns WeChat's
// routine refusal of a reply (the 5-replies window, an ended session)
// finishes its message, counted by reason; the error matches
// ErrReplyWindow / ErrSessionEnded for a handler that tests it. Another
// refusal (an unknown user) still dead-letters it (Permanent).
func TestRoutineRefusalFinishesMessage(t *testing.T) {
	rig := newReplyRig(t)
	var last error
	h := rig.wrap(adapt(HandlerFunc(func(ctx context.Context, m *Message) error {
		n := 1
		if text, _ := m.Text(); text == "six" {
			n = 6
		}
		for i := range n {
			if last = Reply(ctx, kf.Text{Content: fmt.Sprint(i)}); last != nil {
				return last
			}
		}
		return nil
	})))
	ctx := context.Background()
	if err := h.Handle(ctx, rig.message(t, rig.fake.AddText("wk", "u5", "six"))); err != nil {
		t.Fatalf("six replies: the handler's refusal was not settled: %v", err)
	}
	if !errors.Is(last, ErrReplyWindow) || !IsPermanent(last) || errors.Is(last, ErrSessionEnded) {
		t.Fatalf("the sixth reply's error %v, want ErrReplyWindow and Permanent", last)
	}
	if n := len(rig.fake.Replies("wk", "u5")); n != 5 {
		t.Fatalf("%d replies delivered, want 5", n)
	}
	rig.fake.FailNextSend(1, kf.CodeSessionEnded)
	if err := h.Handle(ctx, rig.message(t, rig.fake.AddText("wk", "u6", "hi"))); err != nil || !errors.Is(last, ErrSessionEnded) {
		t.Fatalf("ended session: handler %v, reply %v", err, last)
	}
	rig.fake.FailNextSend(1, kf.CodeInvalidUser)
	if err := h.Handle(ctx, rig.message(t, rig.fake.AddText("wk", "u7", "hi"))); !IsPermanent(err) {
		t.Fatalf("unknown user: %v, want a permanent error", err)
	}
	for reason, want := range map[string]float64{"reply_window": 1, "session_ended": 1, "welcome_code_expired": 0} {
		if n, ok := testenv.Gathered(t, rig.reg, "kfpipe_reply_refusals_total", "reason", reason); !ok || n != want {
			t.Errorf("kfpipe_reply_refusals_total{reason=%q} = %v (series present: %v), want %v", reason, n, ok, want)
		}
	}
}

// TestWebhookAnswerRepliesOnce: the replies in an http receiver's answer
// are sent once across a cut-off run and a re-run; then the transfer. The
// re-run sends the cut-off run's kept answer without calling the receiver
// again; a third run (no answer kept: the second succeeded) calls it, and
// its answer's replies, already sent, are skipped.
func TestWebhookAnswerRepliesOnce(t *testing.T) {
	rig := newReplyRig(t)
	c := rig.message(t, rig.fake.AddText("wk", "u2", "human please"))
	var posts atomic.Int32
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"replies":[{"msgtype":"text","text":{"content":"one"}},` +
			`{"msgtype":"text","text":{"content":"two"}}],"transfer":{"service_state":3,"servicer_userid":"alice"}}`))
	}))
	defer receiver.Close()
	ih := consumer.WebhookHandler(receiver.URL, 5*time.Second, nil, "", webhookReplies)
	h := rig.wrap(ih)
	ctx, cancel := context.WithCancel(context.Background())
	rig.killSecondSend(cancel)
	if err := h.Handle(ctx, c); err == nil {
		t.Fatal("the cut-off run succeeded")
	}
	rig.cut.Store(nil)
	for range 2 {
		if err := h.Handle(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	assertReplies(t, rig.fake, "u2", "one", "two")
	if tr := rig.fake.Transfers(); len(tr) != 1 || tr[0].Servicer != "alice" || tr[0].To != 3 {
		t.Fatalf("transfers %+v", tr)
	}
	if posts.Load() != 2 {
		t.Fatalf("receiver called %d times, want 2 (the cut-off run and the third; the second sent the kept answer)", posts.Load())
	}
}

// TestWebhookTransferMessage: a receiver's transfer with a message sends
// it with the transfer's msg_code (send_msg_on_event), once however often
// the answer comes back.
func TestWebhookTransferMessage(t *testing.T) {
	rig := newReplyRig(t)
	c := rig.message(t, rig.fake.AddText("wk", "u4", "human please"))
	ctx := reply.With(context.Background(), rig.fx, reply.TargetOf(c))
	answer := []byte(`{"transfer":{"service_state":3,"servicer_userid":"alice","message":{"msgtype":"text","text":{"content":"alice is here"}}}}`)
	if err := webhookReplies(ctx, answer); err != nil {
		t.Fatal(err)
	}
	if err := webhookReplies(reply.With(context.Background(), rig.fx, reply.TargetOf(c)), answer); err != nil {
		t.Fatal(err)
	}
	rs := rig.fake.Replies("wk", "u4")
	if len(rs) != 1 || !rs[0].OnEvent || !strings.Contains(string(rs[0].Body), "alice is here") {
		t.Fatalf("replies %+v, want the transfer's message once, with its msg_code", rs)
	}
}

// TestWebhookAnswerChecked: an answer without replies is fine; one with a
// reply that cannot be sent is Permanent before anything is sent.
func TestWebhookAnswerChecked(t *testing.T) {
	rig := newReplyRig(t)
	c := rig.message(t, rig.fake.AddText("wk", "u3", "hi"))
	ctx := reply.With(context.Background(), rig.fx, reply.TargetOf(c))
	for _, ok := range []string{``, `ok`, `{}`, `{"status":"ok"}`} {
		if err := webhookReplies(ctx, []byte(ok)); err != nil {
			t.Errorf("answer %q: %v", ok, err)
		}
	}
	for _, bad := range []string{`{"replies":[{"msgtype":"text","text":{"content":"fine"}},{"msgtype":"voice","voice":{}}]}`,
		`{"replies":"x"}`, `{"transfer":{}}`, `{"transfer":{"service_state":9}}`} {
		if err := webhookReplies(ctx, []byte(bad)); !IsPermanent(err) {
			t.Errorf("answer %s: %v, want a permanent error", bad, err)
		}
	}
	if rs := rig.fake.Replies("wk", "u3"); len(rs) != 0 {
		t.Fatalf("replies sent from bad answers: %+v", rs)
	}
	if err := webhookReplies(context.Background(), []byte(`{"replies":[{"msgtype":"text","text":{"content":"x"}}]}`)); !errors.Is(err, ErrNoReplier) {
		t.Fatalf("replies without a replier: %v", err)
	}
}

func assertReplies(t *testing.T, fake *wecomtest.Server, user string, texts ...string) {
	t.Helper()
	rs := fake.Replies("wk", user)
	if len(rs) != len(texts) || fake.DuplicateMsgIDs() != 0 {
		t.Fatalf("%s: %d replies (%d duplicate msgids), want %d: %+v", user, len(rs), fake.DuplicateMsgIDs(), len(texts), rs)
	}
	for i, r := range rs {
		if !strings.Contains(string(r.Body), `"`+texts[i]+`"`) {
			t.Fatalf("%s: reply %d = %s, want %q", user, i, r.Body, texts[i])
		}
	}
}
